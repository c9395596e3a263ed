"""The generation routes served straight from ASGI, under the app's own middleware but ahead of FastAPI's routing,
dependency solver and body parameter.

A completion request carries every token id of its prompt, and FastAPI's handling of it (route matching, the
middleware and exit stacks, the dependency solver, ``json.loads`` then validation) took ~0.3 ms of the time to first
token at 1024 ids and ~0.5 ms at 4096 on the dev CPU (docs/performance.md, 2026-12-07). ``DirectRoutes`` answers
``POST`` on the paths it is given itself: it reads the body, validates it with the route's pydantic model straight
from the JSON (pydantic's own parser: 188 us at 4096 ids against 357 for ``json.loads`` and Python-mode validation,
as FastAPI does it, on that CPU; where both accept a body they build the same request, tests/test_direct_routes.py),
and awaits the same handler. Whatever it does not take on, it passes to the app unchanged, the messages it read
replayed: another method or path, a body that is not JSON by its content type (or has none), that the parser or the
model refuses, or whose reading failed (a client gone, the body limit). So every error answer about a request's body
stays FastAPI's own. An exception the handler raises is answered by the app's exception handlers, as FastAPI's
exception middleware would answer it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Handler = Callable[[Any, Any, Request], Awaitable[Response]]  # (context, validated body, request) -> response


def _is_json(scope: Scope) -> bool:
    """Whether the request's content type is JSON (``application/json`` or ``application/*+json``), the types
    FastAPI parses a body parameter from."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            mime = value.split(b";", 1)[0].strip().lower()
            return mime == b"application/json" or (
                mime.startswith(b"application/") and mime.endswith(b"+json")
            )
    return False


def _replay(messages: list[Message], failure: BaseException | None, receive: Receive) -> Receive:
    """A receive that gives ``messages`` again, then raises ``failure`` (if reading failed), then goes on."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        if failure is not None:
            raise failure
        return await receive()

    return replayed


class DirectRoutes:
    """ASGI middleware: ``routes`` maps a path to (request model, handler); ``context`` is the handlers' first
    argument; ``api`` is the FastAPI app whose exception handlers answer the handlers' exceptions."""

    def __init__(
        self, app: ASGIApp, api: FastAPI, context: Any, routes: dict[str, tuple[type[BaseModel], Handler]]
    ) -> None:
        self.app = app
        self.api = api
        self.context = context
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = None
        if scope["type"] == "http" and scope["method"] == "POST":
            route = self.routes.get(scope["path"])
        if route is None or not _is_json(scope):
            return await self.app(scope, receive, send)
        messages: list[Message] = []
        failure: BaseException | None = None
        chunks = []
        try:
            while True:
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request":
                    break
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        except Exception as e:  # the body limit's 413 and the like: the app answers them as it always does
            failure = e
        body = b"".join(chunks)
        model, handler = route
        parsed = None
        if failure is None and messages[-1]["type"] == "http.request" and body:
            try:
                parsed = model.model_validate_json(body)
            except Exception:  # not JSON, not valid, or worse (a nesting too deep): the app's answer, as ever
                parsed = None
        if parsed is None:
            return await self.app(scope, _replay(messages, failure, receive), send)
        request = Request(scope, _replay(messages, None, receive))
        try:
            response = await handler(self.context, parsed, request)
        except Exception as e:
            response = await self._answer(request, e)
        await response(scope, receive, send)

    async def _answer(self, request: Request, exc: Exception) -> Response:
        """The app's answer to ``exc``: the handler registered for its class or the nearest base class."""
        handlers = self.api.exception_handlers
        for cls in type(exc).__mro__:
            if cls in handlers:
                return await handlers[cls](request, exc)
        raise exc
