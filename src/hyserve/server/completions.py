"""POST /v1/completions: prompts (texts or token ids) in, choices out, streamed or whole.

Choices are indexed prompt-major: prompt ``p``'s choice ``j`` is ``p * n + j``. ``echo`` puts the prompt in
front of the text and, with ``logprobs``, scores every prompt token too (the first one has nothing to be
scored against, so its logprob is null): that is how lm-eval's ``local-completions`` computes likelihoods.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request
from starlette.responses import Response

from hyserve.engine.outputs import CompletionOutput, RequestOutput
from hyserve.server.async_engine import EngineError, RequestGroup
from hyserve.server.errors import APIError
from hyserve.server.logprobs import completion_logprobs
from hyserve.server.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
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


@dataclass
class _Prompt:
    token_ids: list[int]
    text: str | None  # as sent; None for token ids (decoded only if echo needs it)


def _prompts(ctx: ServingContext, prompt: str | list) -> list[_Prompt]:
    if isinstance(prompt, str):
        return [_Prompt(ctx.encode(prompt), prompt)]
    if not prompt:
        raise APIError(400, "the prompt is empty", "prompt")
    if isinstance(prompt[0], int):
        return [_Prompt(list(prompt), None)]
    if isinstance(prompt[0], str):
        return [_Prompt(ctx.encode(p), p) for p in prompt]
    return [_Prompt(list(p), None) for p in prompt]


@dataclass
class _Sent:
    """How much of one choice a stream has sent."""

    started: bool = False
    chars: int = 0  # characters of generated text
    tokens: int = 0  # generated tokens
    offset: int = 0  # text offset of the next token's logprob entry (characters)
    done: bool = False


@dataclass
class _Job:
    """One completion request while it runs: what the answer needs besides the engine outputs."""

    ctx: ServingContext
    body: CompletionRequest
    prompts: list[_Prompt]
    model: str
    id: str = field(default_factory=lambda: new_id("cmpl"))
    created: int = field(default_factory=now_s)

    def prompt_text(self, p: int) -> str:
        prompt = self.prompts[p]
        if prompt.text is None:
            tok = self.ctx.tokenizer
            prompt.text = "" if tok is None else tok.decode(prompt.token_ids, skip_special_tokens=False)
        return prompt.text

    def prompt_logprobs(self, p: int, out: RequestOutput) -> tuple[CompletionLogprobs, int]:
        return completion_logprobs(self.prompts[p].token_ids, out.prompt_logprobs, self.ctx.texts, 0)

    def usage(self, completion_tokens: int) -> UsageInfo:
        prompt_tokens = sum(len(p.token_ids) for p in self.prompts)
        return UsageInfo(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )

    def choice(self, p: int, out: RequestOutput, c: CompletionOutput) -> CompletionChoice:
        """The whole choice, for a non-streaming answer."""
        text, logprobs, offset = c.text, None, 0
        if self.body.echo:
            text = self.prompt_text(p) + text
        if self.body.logprobs is not None:
            logprobs = CompletionLogprobs()
            if self.body.echo:
                logprobs, offset = self.prompt_logprobs(p, out)
            logprobs.extend(completion_logprobs(c.token_ids, c.logprobs, self.ctx.texts, offset)[0])
        return CompletionChoice(
            index=p * self.body.n + c.index,
            text=text,
            logprobs=logprobs,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
        )

    def response(self, finals: dict[str, RequestOutput], request_ids: list[str]) -> CompletionResponse:
        choices, completion_tokens = [], 0
        for p, request_id in enumerate(request_ids):
            out = finals[request_id]
            for c in out.outputs:
                choices.append(self.choice(p, out, c))
                completion_tokens += len(c.token_ids)
        return CompletionResponse(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=self.usage(completion_tokens),
        )

    async def events(self, group: RequestGroup) -> AsyncIterator[str]:
        """Server-sent events: one chunk per choice and change, a finish chunk per choice, then usage."""
        prompt_of = {request_id: p for p, request_id in enumerate(group.request_ids)}
        sent: dict[int, _Sent] = defaultdict(_Sent)  # by choice index
        try:
            while outs := await group.next():
                for out in outs:
                    p = prompt_of[out.request_id]
                    for c in out.outputs:
                        i = p * self.body.n + c.index
                        if not sent[i].done:
                            chunk = self._delta(p, out, c, sent[i])
                            if chunk is not None:
                                yield sse(chunk, exclude={"usage"})
        except EngineError as e:
            yield sse_error(e)
            yield SSE_DONE
            return
        options = self.body.stream_options
        if options is not None and options.include_usage:
            usage = self.usage(sum(s.tokens for s in sent.values()))
            last = CompletionResponse(
                id=self.id, created=self.created, model=self.model, choices=[], usage=usage
            )
            yield sse(last)
        yield SSE_DONE

    def _delta(
        self, p: int, out: RequestOutput, c: CompletionOutput, sent: _Sent
    ) -> CompletionResponse | None:
        """The chunk for what choice ``c`` has gained since ``sent`` (None: nothing to show yet)."""
        first = not sent.started
        text = (self.prompt_text(p) if self.body.echo and first else "") + c.text[sent.chars :]
        logprobs = None
        if self.body.logprobs is not None:
            logprobs = CompletionLogprobs()
            if self.body.echo and first:
                logprobs, sent.offset = self.prompt_logprobs(p, out)
            entries = c.logprobs[sent.tokens :]
            generated, sent.offset = completion_logprobs(
                c.token_ids[sent.tokens :], entries, self.ctx.texts, sent.offset
            )
            logprobs.extend(generated)
        # like vLLM: a step that produced tokens gets its chunk even when their text is still empty (an
        # incomplete UTF-8 sequence, a held-back stop string, a model without tokenizer files), so that
        # clients can time every token
        new_tokens = len(c.token_ids) > sent.tokens
        sent.started, sent.chars, sent.tokens = True, len(c.text), len(c.token_ids)
        sent.done = c.finish_reason is not None
        if not text and not sent.done and not new_tokens and (logprobs is None or not logprobs.tokens):
            return None
        choice = CompletionChoice(
            index=p * self.body.n + c.index,
            text=text,
            logprobs=logprobs,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
        )
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=[choice])


async def create_completion(ctx: ServingContext, body: CompletionRequest, request: Request) -> Response:
    arrival = time.monotonic()
    model = ctx.resolve_model(body.model)
    ctx.note_ignored(body.model_extra)
    if body.suffix is not None:
        raise APIError(400, "suffix is not supported", "suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(400, "best_of must be unset or equal to n", "best_of")
    job = _Job(ctx, body, _prompts(ctx, body.prompt), model)
    prompt_logprobs = body.logprobs if body.echo else None
    params = build_sampling_params(
        body, ctx.sampling_defaults, body.max_tokens, body.logprobs, prompt_logprobs
    )
    group = ctx.admit([p.token_ids for p in job.prompts], params, arrival, body.stream, "prompt")
    if body.stream:
        return EngineStreamingResponse(job.events(group), on_close=lambda: ctx.engine.abort(group))
    try:
        finals = await unless_disconnected(request, final_outputs(group))
    finally:
        ctx.engine.abort(group)
    return Response(job.response(finals, group.request_ids).model_dump_json(), media_type="application/json")
