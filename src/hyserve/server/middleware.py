"""ASGI middleware for the API key and the body size limit.

Plain ASGI rather than starlette's ``BaseHTTPMiddleware``, which wraps streaming responses in a way that
hides client disconnects from the endpoint.
"""

from __future__ import annotations

import hmac
import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hyserve.server.errors import error_body


async def _send_error(send: Send, status: int, message: str, headers: list | None = None) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": body})


class APIKeyMiddleware:
    """``/v1/*`` needs ``Authorization: Bearer <key>``; /health and /metrics stay open for probes."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or not scope["path"].startswith("/v1"):
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self._expected):
            return await _send_error(
                send, 401, "Incorrect API key provided", [(b"www-authenticate", b"Bearer")]
            )
        return await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Bodies over ``max_bytes`` get 413: at once when Content-Length says so, otherwise as soon as the
    chunks received pass the limit (the endpoint's body parsing then fails with that 413)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        too_large = f"the request body is larger than {self.max_bytes} bytes"
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _send_error(send, 413, too_large)
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, too_large)
            return message

        return await self.app(scope, limited, send)
