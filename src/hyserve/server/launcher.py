"""``hyserve serve``: flags, start-up and a shutdown that drains running requests."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import uvicorn

from hyserve.engine.args import engine_args_from
from hyserve.engine.llm_engine import LLMEngine
from hyserve.server.api import build_app
from hyserve.server.config import ServerConfig

log = logging.getLogger(__name__)

API_KEY_ENV = "HYSERVE_API_KEY"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="model name(s) clients send; the first one is reported (default: the model folder's name)",
    )
    g.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV}, else no key)",
    )
    g.add_argument(
        "--max-queue",
        type=int,
        default=1024,
        help="waiting requests beyond which new ones are refused with 503 at once",
    )
    g.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds to let running requests finish after SIGTERM before exiting",
    )
    g.add_argument("--max-body-bytes", type=int, default=16 << 20, help="larger request bodies get 413")
    g.add_argument(
        "--generation-config",
        choices=["auto", "vllm"],
        default="auto",
        help="auto: default sampling settings from the model's generation_config.json (as vLLM); "
        "vllm: OpenAI's defaults",
    )
    g.add_argument("--disable-uvicorn-access-log", action="store_true")


def server_config_from(ns: argparse.Namespace) -> ServerConfig:
    names = tuple(ns.served_model_name or [Path(ns.model).resolve().name])
    return ServerConfig(
        served_model_names=names,
        host=ns.host,
        port=ns.port,
        api_key=ns.api_key if ns.api_key is not None else os.environ.get(API_KEY_ENV),
        max_queue=ns.max_queue,
        shutdown_timeout=ns.shutdown_timeout,
        max_body_bytes=ns.max_body_bytes,
        use_generation_config=ns.generation_config == "auto",
        access_log=not ns.disable_uvicorn_access_log,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn with a drain that exits cleanly.

    On SIGTERM (or Ctrl-C) uvicorn stops listening and waits up to ``timeout_graceful_shutdown`` for open
    responses to finish, which is the drain we want; ``on_signal`` additionally makes requests arriving on
    open keep-alive connections get 503. uvicorn then re-raises the signal so the process dies of it
    (exit status 143); a drained shutdown is a normal exit here, so the signal is not re-raised.
    """

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_signal = on_signal

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            log.info(
                "signal %d: refusing new requests, letting running ones finish (up to %.0f s)",
                sig,
                self.config.timeout_graceful_shutdown or 0,
            )
        self._on_signal()
        super().handle_exit(sig, frame)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run_server(ns: argparse.Namespace) -> int:
    """Load the model, serve until SIGTERM/SIGINT, drain, exit 0. Bad flags raise ``ValueError``."""
    if not Path(ns.model).is_dir():
        raise ValueError(f"model folder {ns.model} does not exist")
    config = server_config_from(ns)
    engine = LLMEngine(engine_args_from(ns))
    app = build_app(engine, config)
    if config.api_key is None and not _is_loopback(config.host):
        log.warning("listening on %s without an API key: anyone who can reach it can use it", config.host)
    log.info(
        "serving %s (max_model_len %d) on http://%s:%d",
        ", ".join(config.served_model_names),
        engine.max_model_len,
        config.host,
        config.port,
    )
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_config=None,
        log_level=getattr(ns, "log_level", "INFO").lower(),
        access_log=config.access_log,
        timeout_graceful_shutdown=config.shutdown_timeout,
        lifespan="on",
    )

    def drain() -> None:
        app.state.ctx.draining = True

    server = DrainingServer(uv_config, on_signal=drain)
    server.run()
    return 0 if server.started else 1
