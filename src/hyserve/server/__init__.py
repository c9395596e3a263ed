"""The OpenAI-compatible HTTP server (``hyserve serve``)."""

from hyserve.server.api import build_app
from hyserve.server.config import ServerConfig
from hyserve.server.launcher import add_serve_arguments, run_server

__all__ = ["ServerConfig", "add_serve_arguments", "build_app", "run_server"]
