"""A fake OpenAI-compatible streaming ``/v1/completions`` server for the bench tests.

Streams ``max_tokens`` tokens as SSE chunks (``tokens_per_chunk`` per chunk, ``token_delay_s`` each), then a
usage chunk and ``data: [DONE]``. ``fail_every=n`` answers every n-th completion request with HTTP 500.
Runs an aiohttp app on its own event loop in a daemon thread; standalone: ``python tests/fake_openai_server.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from typing import Any

from aiohttp import web


class FakeOpenAIServer:
    """Use as a context manager; ``url`` is the base URL, ``requests`` the completion bodies received,
    ``max_in_flight`` the most completion streams open at once."""

    def __init__(
        self,
        *,
        model: str = "fake-model",
        token_delay_s: float = 0.002,
        prefill_s_per_token: float = 0.0,
        tokens_per_chunk: int = 1,
        fail_every: int = 0,
        send_usage: bool = True,
        api_key: str | None = None,
        port: int = 0,
    ) -> None:
        self.model = model
        self.token_delay_s = token_delay_s
        self.prefill_s_per_token = prefill_s_per_token
        self.tokens_per_chunk = tokens_per_chunk
        self.fail_every = fail_every
        self.send_usage = send_usage
        self.api_key = api_key
        self.port = port
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _authorized(self, request: web.Request) -> bool:
        return self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}"

    async def _models(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if not self._authorized(request):
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        if self.fail_every and len(self.requests) % self.fail_every == 0:
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._stream(request, body, len(self.requests))
        finally:
            self.in_flight -= 1

    async def _stream(self, request: web.Request, body: dict[str, Any], index: int) -> web.StreamResponse:
        prompt, max_tokens = body["prompt"], int(body["max_tokens"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await asyncio.sleep(self.prefill_s_per_token * len(prompt))
        base = {
            "id": f"cmpl-{index}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
        }
        sent = 0
        while sent < max_tokens:
            k = min(self.tokens_per_chunk, max_tokens - sent)
            await asyncio.sleep(self.token_delay_s * k)
            sent += k
            choice = {"index": 0, "text": " tok" * k, "logprobs": None, "finish_reason": None}
            if sent == max_tokens:
                choice["finish_reason"] = "length"
            await resp.write(f"data: {json.dumps({**base, 'choices': [choice]})}\n\n".encode())
        if self.send_usage and (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": sent,
                "total_tokens": len(prompt) + sent,
            }
            await resp.write(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def start(self) -> FakeOpenAIServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--token-delay-s", type=float, default=0.01)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--fail-every", type=int, default=0)
    ns = ap.parse_args()
    server = FakeOpenAIServer(
        port=ns.port,
        token_delay_s=ns.token_delay_s,
        tokens_per_chunk=ns.tokens_per_chunk,
        fail_every=ns.fail_every,
    ).start()
    print(f"fake OpenAI server on {server.url}; Ctrl-C stops it", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()
