"""OpenAI-shaped errors: every failure, including FastAPI's own, answers ``{"error": {...}}``.

OpenAI clients parse that body to build their exception, so a bare ``{"detail": ...}`` (FastAPI's default)
would lose the message. The ``type`` names follow OpenAI for 4xx request errors and vLLM elsewhere.
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "NotFoundError",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


# pydantic names the member of a union that failed inside the location ("prompt.list[int].0"); clients
# think in fields, so those parts are dropped
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|none|list|dict)$|\[")


class APIError(Exception):
    """A request that cannot be served; ``status`` is the HTTP status it answers with."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> dict:
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """The first few pydantic errors as one line, and the field of the first one."""
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":
        reason = errors[0].get("ctx", {}).get("error", "JSON decode error")
        return f"the body is not valid JSON: {reason}", None
    parts, first = [], None
    for err in errors[:3]:
        loc = err.get("loc", ())
        where = ".".join(str(x) for x in loc if x != "body" and not _UNION_MEMBER.search(str(x)))
        first = first or where or None
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if not where and err.get("type") == "model_attributes_type":
            msg = "the body must be a JSON object"
        parts.append(f"{where}: {msg}" if where else msg)
    more = len(errors) - 3
    message = "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
    return message or "invalid request", first


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return JSONResponse(error_body(exc.status_code, detail), exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error while serving a request")
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
