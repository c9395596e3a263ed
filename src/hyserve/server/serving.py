"""What the completion and chat handlers share: admission (model name, prompt checks, queue limit),
waiting for results while watching for the client to leave, and server-sent events."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from hyserve.engine.outputs import RequestOutput
from hyserve.engine.sampling_params import SamplingParams
from hyserve.server.async_engine import AsyncEngine, EngineError, RequestGroup
from hyserve.server.config import ServerConfig
from hyserve.server.errors import APIError, error_body
from hyserve.server.logprobs import TokenTexts

log = logging.getLogger(__name__)
T = TypeVar("T")

SSE_DONE = "data: [DONE]\n\n"
_MAX_IGNORED_NAMES = 256


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


@dataclass
class ServingContext:
    engine: AsyncEngine
    config: ServerConfig
    tokenizer: Any  # a transformers tokenizer, or None (token ids only)
    sampling_defaults: dict[str, float]
    texts: TokenTexts = field(init=False)
    draining: bool = False  # set on SIGTERM: running requests finish, new ones get 503
    _ignored: set[str] = field(default_factory=set, init=False, repr=False)  # unknown fields logged so far

    def __post_init__(self) -> None:
        self.texts = TokenTexts(self.tokenizer)

    def note_ignored(self, fields: dict[str, Any] | None) -> None:
        """Log request fields this server does not know, once per name (clients send many optional ones;
        the names remembered are capped, as clients choose them)."""
        new = set(fields or ()) - self._ignored
        if new and len(self._ignored) < _MAX_IGNORED_NAMES:
            self._ignored |= new
            log.warning("ignoring request fields this server does not know: %s", ", ".join(sorted(new)))

    def resolve_model(self, name: str | None) -> str:
        """The name to answer with; 404 for a model this server does not serve."""
        if name is None:
            return self.config.model_name
        if name not in self.config.served_model_names:
            raise APIError(404, f"The model `{name}` does not exist.", "model")
        return name

    def encode(self, text: str) -> list[int]:
        """Text as the engine gets it: no special tokens added (a chat template has its own)."""
        if self.tokenizer is None:
            raise APIError(400, "this model has no tokenizer: send token ids", "prompt")
        return self.tokenizer.encode(text, add_special_tokens=False)

    def admit(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        arrival_time: float,
        stream: bool,
        param: str,
    ) -> RequestGroup:
        """Check every prompt against the model, then queue them all, or none (400 / 503)."""
        for token_ids in prompts:
            try:
                self.engine.engine.validate_prompt(token_ids, params)
            except ValueError as e:
                raise APIError(400, str(e), param) from e
        if self.draining:
            raise APIError(503, "the server is shutting down")
        if len(prompts) > self.config.max_queue:
            raise APIError(
                400, f"{len(prompts)} prompts in one request; at most {self.config.max_queue}", param
            )
        if self.engine.num_waiting + len(prompts) > self.config.max_queue:
            raise APIError(
                503, f"the server is at capacity ({self.config.max_queue} waiting requests); retry later"
            )
        try:
            return self.engine.add(prompts, params, arrival_time, stream)
        except EngineError as e:
            raise APIError(e.status, e.message) from e


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client disconnects first (then raises ``ClientGone``)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():  # the client left (or this handler is being cancelled)
            task.cancel()
    if task not in done:
        raise ClientGone()
    return task.result()


async def final_outputs(group: RequestGroup) -> dict[str, RequestOutput]:
    """Wait for every request of the group to finish; raises ``APIError`` when one fails."""
    finals: dict[str, RequestOutput] = {}
    try:
        while outs := await group.next():
            finals.update((out.request_id, out) for out in outs if out.finished)
    except EngineError as e:
        raise APIError(e.status, e.message) from e
    return finals


def sse(payload: BaseModel, exclude: set[str] | None = None) -> str:
    return f"data: {payload.model_dump_json(exclude=exclude)}\n\n"


def sse_error(error: EngineError) -> str:
    return f"data: {json.dumps(error_body(error.status, error.message))}\n\n"


class EngineStreamingResponse(StreamingResponse):
    """A server-sent-events stream that aborts its engine requests however it ends: finished, client
    gone (starlette cancels the stream on ``http.disconnect``), send failure or server shutdown."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
