"""Running hyserve's HTTP server inside the test process, on a real socket, in a background thread.

Each server gets its own engine, event loop and metrics registry, so one test module can run several
side by side; the tiny checkpoint is written once per test session.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hyserve.engine.llm_engine import EngineArgs, LLMEngine
from hyserve.server import ServerConfig
from hyserve.server.api import build_app
from hyserve.server.draining import build_server
from tokenizer_fixture import make_text_checkpoint

MODEL_NAME = "tiny-qwen"
MAX_MODEL_LEN = 256
# two layers, one of each kind, keep every step cheap on a CPU
CHECKPOINT = dict(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])


@functools.cache
def text_checkpoint() -> Path:
    path = Path(tempfile.mkdtemp(prefix="hyserve-server-test-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return make_text_checkpoint(path, seed=3, **CHECKPOINT)


class BackgroundServer:
    """``with BackgroundServer(...) as server:`` serves on ``server.url`` until the block ends."""

    def __init__(self, model_dir: Path, engine_kwargs: dict[str, Any] | None = None, **server_kwargs: Any):
        args = dict(device="cpu", dtype="float32", progress=False, max_model_len=MAX_MODEL_LEN)
        self.engine = LLMEngine(EngineArgs(model=str(model_dir), **(args | (engine_kwargs or {}))))
        self.config = ServerConfig(served_model_names=(MODEL_NAME,), access_log=False, **server_kwargs)
        self.app = build_app(self.engine, self.config)
        self.async_engine = self.app.state.ctx.engine
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = build_server(self.app, self.config, log_level="warning")
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=f"test-server-{self.port}", daemon=True)

    def _serve(self) -> None:
        self.loop.run_until_complete(self._server.serve(sockets=[self._sock]))
        # what the process exit does for ``hyserve serve``: drop connections a cut-off request left open
        for connection in list(self._server.server_state.connections):
            connection.transport.close()
        self.loop.run_until_complete(asyncio.sleep(0))

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self.loop.close()
        self._sock.close()

    def terminate(self) -> None:
        """What SIGTERM does to ``hyserve serve`` (signals reach only the main thread, so call it)."""
        self._server.handle_exit(signal.SIGTERM, None)

    @property
    def exited(self) -> bool:
        return not self._thread.is_alive()

    def in_loop(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's event loop (where its asyncio state lives) and return its result."""

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def num_tasks(self) -> int:
        return self.in_loop(lambda: len(asyncio.all_tasks()))

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics by name (labels dropped: each server has one model)."""
        text = httpx.get(f"{self.url}/metrics").text
        return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Until the engine holds no request and every KV block and state slot is free again."""
        cache = self.engine.cache_manager
        deadline = time.monotonic() + timeout
        while True:
            idle = (
                not self.engine.requests
                and self.async_engine.num_unfinished == 0
                and cache.num_free_blocks == cache.config.num_blocks
                and cache.num_free_slots == cache.config.num_state_slots
            )
            if idle:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not idle after {timeout} s: {len(self.engine.requests)} engine requests, "
                    f"{cache.num_free_blocks}/{cache.config.num_blocks} blocks and "
                    f"{cache.num_free_slots}/{cache.config.num_state_slots} slots free"
                )
            time.sleep(0.02)
