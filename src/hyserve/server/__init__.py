"""The OpenAI-compatible HTTP server (``hyserve serve``); the app itself is ``hyserve.server.api``."""

from hyserve.server.config import ServerConfig
from hyserve.server.launcher import add_serve_arguments, run_server

__all__ = ["ServerConfig", "add_serve_arguments", "run_server"]
