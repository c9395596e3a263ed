"""Bad requests get an OpenAI-shaped 4xx (or 5xx) and the server keeps serving; the API key guards /v1/*.

One server for the module, with an API key, a two-sequence batch and a two-request queue, so "queue
full" is reachable with a handful of streams.
"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from server_harness import MAX_MODEL_LEN, MODEL_NAME, BackgroundServer, text_checkpoint
from tokenizer_fixture import CHECKPOINT_VOCAB

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BODY = 4096


@pytest.fixture(scope="module")
def server():
    engine = dict(max_num_seqs=2)
    with BackgroundServer(
        text_checkpoint(), engine_kwargs=engine, api_key=KEY, max_queue=2, max_body_bytes=MAX_BODY
    ) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        yield c


def _still_serving(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


def _expect_error(r: httpx.Response, status: int, param: str | None = None, contains: str = "") -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert error["code"] == status
    if status == 400:
        assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param, error
    assert contains in error["message"], error["message"]


COMPLETION_CASES = {
    "missing prompt": ({"max_tokens": 2}, "prompt", "Field required"),
    "prompt of the wrong type": ({"prompt": 5}, "prompt", "must be a string"),
    "prompt of mixed types": ({"prompt": [1, "a"]}, "prompt", "must be a string"),
    "boolean token ids": ({"prompt": [True, False]}, "prompt", "must be a string"),
    "temperature of the wrong type": ({"prompt": "x", "temperature": "hot"}, "temperature", "valid number"),
    "n of the wrong type": ({"prompt": "x", "n": "many"}, "n", "valid integer"),
    "stream of the wrong type": ({"prompt": "x", "stream": "sometimes"}, "stream", "boolean"),
    "negative temperature": ({"prompt": "x", "temperature": -1}, "temperature", "temperature must be >= 0"),
    "top_p of 0": ({"prompt": "x", "top_p": 0}, "top_p", "top_p must be in (0, 1]"),
    "top_p above 1": ({"prompt": "x", "top_p": 1.5}, "top_p", "top_p"),
    "top_k below -1": ({"prompt": "x", "top_k": -2}, "top_k", "top_k"),
    "min_p above 1": ({"prompt": "x", "min_p": 2}, "min_p", "min_p"),
    "repetition_penalty of 0": ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty", ""),
    "presence_penalty above 2": ({"prompt": "x", "presence_penalty": 3}, "presence_penalty", ""),
    "frequency_penalty below -2": ({"prompt": "x", "frequency_penalty": -3}, "frequency_penalty", ""),
    "n of 0": ({"prompt": "x", "n": 0}, "n", ""),
    "n too large": ({"prompt": "x", "n": 1000}, "n", ""),
    "negative max_tokens": ({"prompt": "x", "max_tokens": -1}, "max_tokens", "max_tokens must be >= 0"),
    "min_tokens above max_tokens": ({"prompt": "x", "max_tokens": 2, "min_tokens": 5}, "min_tokens", ""),
    "logprobs above 20": ({"prompt": "x", "logprobs": 21}, "logprobs", "logprobs must be in 0..20"),
    "token id past the vocabulary": ({"prompt": [1, CHECKPOINT_VOCAB]}, "prompt", "outside the vocabulary"),
    "negative token id": ({"prompt": [[1, 2], [-1]]}, "prompt", "outside the vocabulary"),
    "prompt plus max_tokens too long": (
        {"prompt": list(range(1, 200)), "max_tokens": MAX_MODEL_LEN},
        "prompt",
        "exceeds the model length",
    ),
    "prompt alone too long": ({"prompt": [7] * MAX_MODEL_LEN}, "prompt", "model's length"),
    "empty text prompt": ({"prompt": ""}, "prompt", "empty"),
    "empty prompt list": ({"prompt": []}, "prompt", "empty"),
    "empty token list": ({"prompt": [[]]}, "prompt", "empty"),
    "empty text in a list": ({"prompt": ["fine", ""]}, "prompt", "empty"),
    "suffix": ({"prompt": "x", "suffix": "y"}, "suffix", "suffix"),
    "best_of other than n": ({"prompt": "x", "best_of": 3}, "best_of", "best_of"),
    "logit_bias": ({"prompt": "x", "logit_bias": {"5": 10}}, "logit_bias", "logit_bias"),
    "stream_options without stream": (
        {"prompt": "x", "stream_options": {"include_usage": True}},
        "stream_options",
        "",
    ),
    "stop of the wrong type": ({"prompt": "x", "stop": 5}, None, "stop"),
}


@pytest.mark.parametrize("case", list(COMPLETION_CASES))
def test_bad_completion_requests(http, case):
    body, param, contains = COMPLETION_CASES[case]
    _expect_error(http.post("/v1/completions", json=body), 400, param, contains)
    _still_serving(http)


MESSAGES_OK = [{"role": "user", "content": "hi"}]
CHAT_CASES = {
    "missing messages": ({}, "messages", "Field required"),
    "empty messages": ({"messages": []}, "messages", "at least 1"),
    "messages not a list": ({"messages": "hi"}, "messages", "valid list"),
    "message without role": ({"messages": [{"content": "hi"}]}, "messages.0.role", "Field required"),
    "unknown role": ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role", ""),
    "user message without content": ({"messages": [{"role": "user"}]}, "messages.0", "needs content"),
    "image content part": (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages.0.content",
        "only text",
    ),
    "content of the wrong type": ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content", ""),
    "top_logprobs without logprobs": ({"messages": MESSAGES_OK, "top_logprobs": 2}, "top_logprobs", ""),
    "top_logprobs above 20": (
        {"messages": MESSAGES_OK, "logprobs": True, "top_logprobs": 21},
        "logprobs",
        "",
    ),
    "tool_choice auto": ({"messages": MESSAGES_OK, "tool_choice": "auto"}, "tool_choice", ""),
    "json response_format": (
        {"messages": MESSAGES_OK, "response_format": {"type": "json_object"}},
        "response_format",
        "",
    ),
    "max_tokens past the model length": (
        {"messages": MESSAGES_OK, "max_tokens": MAX_MODEL_LEN},
        "messages",
        "",
    ),
    "chat_template_kwargs clashing with the call": (
        {"messages": MESSAGES_OK, "chat_template_kwargs": {"tokenize": True}},
        "messages",
        "chat template",
    ),
}


@pytest.mark.parametrize("case", list(CHAT_CASES))
def test_bad_chat_requests(http, case):
    body, param, contains = CHAT_CASES[case]
    _expect_error(http.post("/v1/chat/completions", json=body), 400, param, contains)
    _still_serving(http)


@pytest.mark.parametrize(
    "content, headers, contains",
    [
        (b'{"prompt": "x", ', {"content-type": "application/json"}, "not valid JSON"),
        (b"[1, 2]", {"content-type": "application/json"}, "JSON object"),
        (b"prompt=x", {"content-type": "application/x-www-form-urlencoded"}, ""),
    ],
)
def test_malformed_bodies(http, content, headers, contains):
    _expect_error(http.post("/v1/completions", content=content, headers=headers), 400, None, contains)
    _still_serving(http)


def test_unknown_model_route_and_method(http):
    _expect_error(http.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"}), 404, "model", "gpt-9")
    _expect_error(http.post("/v1/chat/completions", json={"model": "gpt-9", "messages": MESSAGES_OK}), 404)
    _expect_error(http.get("/v1/models/gpt-9"), 404, "model")
    r = http.get("/v1/nothing-here")
    _expect_error(r, 404)
    assert r.json()["error"]["type"] == "NotFoundError"
    _expect_error(http.get("/v1/completions"), 405)
    _still_serving(http)


def test_oversized_bodies_get_413(http):
    big = {"prompt": "x" * (MAX_BODY + 100)}
    _expect_error(http.post("/v1/completions", json=big), 413, None, str(MAX_BODY))

    def chunks():  # no Content-Length: the limit must hold while the body streams in
        for _ in range(8):
            yield b" " * 1024

    r = http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    _expect_error(r, 413)
    _still_serving(http)


def test_full_queue_gets_503_at_once(server, http):
    """Two sequences run, two wait (the queue limit): the next request is refused without waiting."""
    # streams that run to the model length: they cannot finish before the test is over
    body = {"prompt": [5], "max_tokens": MAX_MODEL_LEN - 1, "temperature": 0, "ignore_eos": True}
    stop = threading.Event()
    statuses: list[int] = []

    def hold_stream() -> None:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
            with c.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
                statuses.append(r.status_code)
                for _ in r.iter_lines():
                    if stop.is_set():
                        break

    def wait_for(what: str, ok) -> None:
        deadline = time.monotonic() + 30
        while not ok():
            assert time.monotonic() < deadline, what
            time.sleep(0.01)

    threads = [threading.Thread(target=hold_stream) for _ in range(4)]
    try:
        for t in threads[:2]:
            t.start()
        wait_for("two running", lambda: server.async_engine.stats.num_running == 2)
        for t in threads[2:]:
            t.start()
        wait_for("two waiting", lambda: server.async_engine.num_waiting == 2)
        r = http.post("/v1/completions", json={"prompt": "one more", "max_tokens": 2})
        _expect_error(r, 503, None, "capacity")
        assert r.json()["error"]["type"] == "ServiceUnavailableError"
        assert server.async_engine.num_unfinished == 4  # refused while the queue was still full
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert statuses == [200] * 4
    server.wait_idle()
    _still_serving(http)


def test_engine_failure_fails_its_requests_with_500_and_serving_goes_on(server, http):
    model = server.engine.model
    real = model.forward
    calls = 0

    def explode(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected kernel failure")
        return real(*args, **kwargs)

    model.forward = explode
    try:
        r = http.post("/v1/completions", json={"prompt": "boom", "max_tokens": 4})
        _expect_error(r, 500, None, "injected kernel failure")
        assert r.json()["error"]["type"] == "InternalServerError"
        calls = 0
        with http.stream("POST", "/v1/chat/completions", json={"messages": MESSAGES_OK, "stream": True}) as s:
            lines = [line for line in s.iter_lines() if line]
        assert s.status_code == 200  # the failure came after the headers: it arrives as an event
        assert "injected kernel failure" in lines[-2] and lines[-1] == "data: [DONE]", lines
    finally:
        del model.forward  # back to the class's
    server.wait_idle()
    assert server.metrics()["hyserve:request_failure_total"] == 2
    _still_serving(http)


def test_api_key_guards_v1_only(server):
    with httpx.Client(base_url=server.url, timeout=30) as anon:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions")):
                r = anon.request(method, path, headers=headers, json={"prompt": "x"})
                _expect_error(r, 401)
        assert anon.get("/health").status_code == 200
        assert anon.get("/metrics").status_code == 200
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=1).usage.completion_tokens == 1


def test_openai_client_sees_the_error_message(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt="x", temperature=-1)
    assert "temperature must be >= 0" in info.value.message
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
