"""uvicorn with a shutdown that drains running requests and exits cleanly."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn
from fastapi import FastAPI

from hyserve.server.config import ServerConfig

log = logging.getLogger(__name__)


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


def build_server(app: FastAPI, config: ServerConfig, log_level: str = "info") -> DrainingServer:
    """The uvicorn server for ``app`` (from ``hyserve.server.api.build_app``); SIGTERM sets
    ``app.state.ctx.draining`` so that new requests get 503 while running ones finish."""

    def drain() -> None:
        app.state.ctx.draining = True

    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_config=None,
        log_level=log_level,
        access_log=config.access_log,
        timeout_graceful_shutdown=config.shutdown_timeout,
        lifespan="on",
    )
    return DrainingServer(uv_config, on_signal=drain)
