"""``server.direct_routes``: a valid JSON body goes to the handler without FastAPI's request handling, and every
other request gets exactly the answer the app gives without the direct route (a tiny app here; the server's
error tests run the real one, which has it)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse, Response

from hyserve.server.direct_routes import DirectRoutes
from hyserve.server.errors import APIError, install_error_handlers
from hyserve.server.middleware import BodyLimitMiddleware
from hyserve.server.protocol import ChatCompletionRequest, CompletionRequest


class Echo(BaseModel):
    model_config = ConfigDict(extra="allow")
    prompt: list[int] | str
    n: int = 1


async def echo(context: str, body: Echo, request: Request) -> Response:
    if body.n == 0:
        raise APIError(400, "n must be positive", "n")
    if body.n < 0:
        raise RuntimeError("boom")
    return JSONResponse({"via": context, "prompt": body.prompt, "n": body.n, "path": request.url.path})


def _app(direct: bool) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/echo")
    async def route(body: Echo, request: Request) -> Response:
        return await echo("fastapi", body, request)

    if direct:
        app.add_middleware(DirectRoutes, api=app, context="direct", routes={"/echo": (Echo, echo)})
    app.add_middleware(BodyLimitMiddleware, max_bytes=64)
    return app


def _post(app: FastAPI, content: bytes, headers: dict[str, str], method: str = "POST") -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.request(method, "/echo", content=content, headers=headers)

    return asyncio.run(go())


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    "content, headers",
    [
        (b'{"prompt": [1, 2, 3]}', JSON),
        (b'{"prompt": "hi", "n": 2, "other": 1}', {"content-type": "application/json; charset=utf-8"}),
        (b'{"prompt": [7]}', {"content-type": "application/vnd.api+json"}),
    ],
)
def test_a_valid_json_body_takes_the_direct_route(content, headers):
    direct, plain = _post(_app(True), content, headers), _post(_app(False), content, headers)
    assert direct.status_code == plain.status_code == 200
    assert direct.json() == plain.json() | {"via": "direct"}
    assert plain.json()["via"] == "fastapi"


@pytest.mark.parametrize(
    "content, headers, method",
    [
        (b'{"prompt": [1, 2', JSON, "POST"),  # not JSON
        (b'{"prompt": [1, "x"]}', JSON, "POST"),  # fails validation
        (b'{"n": 2}', JSON, "POST"),  # a required field missing
        (b"[1, 2]", JSON, "POST"),  # not an object
        (b"", JSON, "POST"),  # no body
        (b'{"prompt": [1]}', {"content-type": "text/plain"}, "POST"),  # not a JSON content type
        (b'{"prompt": [1]}', {}, "POST"),  # no content type
        (b'{"prompt": [' + b"1, " * 40 + b"1]}", JSON, "POST"),  # over the body limit
        (b'{"prompt": [1]}', JSON, "PUT"),  # another method
        (b'{"prompt": [1], "n": 0}', JSON, "POST"),  # the handler's APIError
        (b'{"prompt": [1], "n": -1}', JSON, "POST"),  # the handler fails: the app's 500 answer
    ],
)
def test_everything_else_gets_the_apps_own_answer(content, headers, method):
    direct, plain = _post(_app(True), content, headers, method), _post(_app(False), content, headers, method)
    assert direct.status_code == plain.status_code != 200
    assert direct.content == plain.content


REAL_BODIES = [
    (
        CompletionRequest,
        {"prompt": "hi", "max_tokens": 16.0, "temperature": 1, "other": {"a": [1, 2.5, None]}},
    ),
    (CompletionRequest, {"prompt": ["a", "b"], "n": 2, "stop": "x", "logit_bias": {"5": 1}, "echo": True}),
    (
        CompletionRequest,
        {"prompt": list(range(4096)), "stream": True, "stream_options": {"include_usage": True}},
    ),
    (CompletionRequest, {"prompt": [[1, 2], [3]], "seed": 7, "stop_token_ids": [1, 2], "logprobs": 2}),
    (CompletionRequest, {"prompt": [1, 2], "temperature": 1e308, "top_p": 0.5, "big": 2**100, "top_k": -1}),
    (
        CompletionRequest,
        {"prompt": [1], "prompt_logprobs": None, "min_p": 0, "ignore_eos": True, "user": "é"},
    ),
    (
        ChatCompletionRequest,
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "x", "type": "function"}]},
                {"role": "tool", "content": "42", "tool_call_id": "x"},
            ],
            "max_tokens": 3,
            "logprobs": True,
            "top_logprobs": 2,
        },
    ),
]


@pytest.mark.parametrize("model, body", REAL_BODIES)
def test_the_direct_parse_builds_the_request_fastapi_builds(model, body):
    """The direct route validates straight from the JSON; FastAPI validates ``json.loads``' objects in Python mode.
    Where both accept a body, they must build the same request."""
    raw = json.dumps(body).encode()
    direct = model.model_validate_json(raw)
    plain = model.model_validate(json.loads(raw), from_attributes=True)
    assert direct.model_dump() == plain.model_dump() and direct.model_extra == plain.model_extra
