"""POST /v1/chat/completions: the checkpoint's chat template renders the messages into one prompt.

Streams follow OpenAI: for each choice a first chunk with ``delta.role``, then content deltas, then a chunk
with ``finish_reason``; with ``stream_options.include_usage`` every chunk has ``usage: null`` and a last
chunk with no choices carries the totals.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import jinja2
from fastapi import Request
from starlette.responses import Response

from hyserve.engine.outputs import CompletionOutput, RequestOutput
from hyserve.server.async_engine import EngineError, RequestGroup
from hyserve.server.errors import APIError
from hyserve.server.logprobs import chat_logprobs
from hyserve.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    DeltaMessage,
    UsageInfo,
    new_id,
    now_s,
)
from hyserve.server.sampling import build_sampling_params
from hyserve.server.serving import (
    SSE_DONE,
    EngineStreamingResponse,
    ServingContext,
    final_outputs,
    sse,
    sse_error,
    unless_disconnected,
)


def render_prompt(ctx: ServingContext, body: ChatCompletionRequest) -> list[int]:
    """The messages through the chat template, as token ids. Template errors are the request's fault."""
    if ctx.tokenizer is None or not getattr(ctx.tokenizer, "chat_template", None):
        raise APIError(400, "this model has no chat template; use /v1/completions", "messages")
    if body.tool_choice not in (None, "none"):
        raise APIError(
            400, "tool calls are not parsed by this server: tool_choice must be 'none'", "tool_choice"
        )
    if body.response_format is not None and body.response_format.get("type", "text") != "text":
        raise APIError(400, "response_format other than text is not supported", "response_format")
    if body.add_generation_prompt and body.continue_final_message:
        raise APIError(400, "add_generation_prompt and continue_final_message exclude each other")
    kwargs = dict(body.chat_template_kwargs or {})
    if body.tools is not None:
        kwargs["tools"] = body.tools
    try:
        text = ctx.tokenizer.apply_chat_template(
            [m.for_template() for m in body.messages],
            tokenize=False,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            **kwargs,
        )
    except (jinja2.TemplateError, TypeError, ValueError, KeyError) as e:
        raise APIError(400, f"the chat template failed on these messages: {e}", "messages") from e
    return ctx.encode(text)


@dataclass
class _Job:
    ctx: ServingContext
    body: ChatCompletionRequest
    prompt_tokens: int
    model: str
    id: str = field(default_factory=lambda: new_id("chatcmpl"))
    created: int = field(default_factory=now_s)

    def usage(self, completion_tokens: int) -> UsageInfo:
        return UsageInfo(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=self.prompt_tokens + completion_tokens,
        )

    def _logprobs(self, c: CompletionOutput, start: int) -> ChatLogprobs | None:
        if not self.body.logprobs:
            return None
        ids = c.token_ids[start:]
        return ChatLogprobs(content=chat_logprobs(ids, (c.logprobs or [])[start:], self.ctx.texts))

    def response(self, out: RequestOutput) -> ChatCompletionResponse:
        choices = [
            ChatChoice(
                index=c.index,
                message=AssistantMessage(content=c.text),
                logprobs=self._logprobs(c, 0),
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            )
            for c in out.outputs
        ]
        return ChatCompletionResponse(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=self.usage(sum(len(c.token_ids) for c in out.outputs)),
        )

    def _chunk(self, choice: ChatChunkChoice) -> str:
        chunk = ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[choice])
        return sse(chunk, exclude=None if self._include_usage else {"usage"})

    @property
    def _include_usage(self) -> bool:
        return self.body.stream_options is not None and self.body.stream_options.include_usage

    async def events(self, group: RequestGroup) -> AsyncIterator[str]:
        n = self.body.n
        for i in range(n):
            yield self._chunk(ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content="")))
        chars, tokens, done = [0] * n, [0] * n, [False] * n
        try:
            while outs := await group.next():
                for out in outs:
                    for c in out.outputs:
                        i = c.index
                        if done[i]:
                            continue
                        text = c.text[chars[i] :]
                        logprobs = self._logprobs(c, tokens[i])
                        chars[i], tokens[i] = len(c.text), len(c.token_ids)
                        has_logprobs = logprobs is not None and bool(logprobs.content)
                        if text or has_logprobs or c.finish_reason is not None:
                            choice = ChatChunkChoice(
                                index=i,
                                delta=DeltaMessage(content=text) if text else DeltaMessage(),
                                logprobs=logprobs if has_logprobs else None,
                                finish_reason=c.finish_reason,
                                stop_reason=c.stop_reason,
                            )
                            yield self._chunk(choice)
                        done[i] = c.finish_reason is not None
        except EngineError as e:
            yield sse_error(e)
            yield SSE_DONE
            return
        if self._include_usage:
            last = ChatCompletionChunk(
                id=self.id, created=self.created, model=self.model, choices=[], usage=self.usage(sum(tokens))
            )
            yield sse(last)
        yield SSE_DONE


async def create_chat_completion(
    ctx: ServingContext, body: ChatCompletionRequest, request: Request
) -> Response:
    arrival = time.monotonic()
    model = ctx.resolve_model(body.model)
    ctx.note_ignored(body.model_extra)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
    token_ids = render_prompt(ctx, body)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = build_sampling_params(body, ctx.sampling_defaults, max_tokens, logprobs)
    group = ctx.admit([token_ids], params, arrival, body.stream, "messages")
    job = _Job(ctx, body, len(token_ids), model)
    if body.stream:
        return EngineStreamingResponse(job.events(group), on_close=lambda: ctx.engine.abort(group))
    try:
        finals = await unless_disconnected(request, final_outputs(group))
    finally:
        ctx.engine.abort(group)
    return Response(
        job.response(finals[group.request_ids[0]]).model_dump_json(), media_type="application/json"
    )
