"""Logprobs in the two OpenAI shapes: the legacy completions lists and chat's per-token objects."""

from __future__ import annotations

from typing import Any

from hyserve.engine.outputs import TokenLogprob as EngineLogprob
from hyserve.server.protocol import CompletionLogprobs, TokenLogprob, TopLogprob

LOGPROB_FLOOR = -9999.0  # JSON has no -inf; vLLM clamps to the same value


def _clamp(logprob: float) -> float:
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


class TokenTexts:
    """The text of a single token (special tokens included), cached: logprob entries show each token
    on its own, and the same few thousand tokens come back again and again."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            if self._tokenizer is None:
                text = f"token_id:{token_id}"
            else:
                text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text


def completion_logprobs(
    token_ids: list[int], entries: list[EngineLogprob | None], texts: TokenTexts, offset: int
) -> tuple[CompletionLogprobs, int]:
    """``entries[i]`` scores ``token_ids[i]`` (None: unscored, the first prompt token). ``offset``: where
    the first token starts in the choice's text (characters). Returns the lists and the offset after."""
    out = CompletionLogprobs()
    for token_id, entry in zip(token_ids, entries):
        token = texts(token_id)
        out.tokens.append(token)
        out.text_offset.append(offset)
        offset += len(token)
        if entry is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        chosen, alternatives = entry
        # keyed by text, so tokens that decode alike (partial UTF-8: all "\ufffd") share a key: keep the
        # first, best one, so the dict's max stays the true best. The chosen token is always in it (OpenAI:
        # up to k + 1 entries).
        top: dict[str, float] = {}
        for t, lp in [*alternatives, (token_id, chosen)]:
            top.setdefault(texts(t), _clamp(lp))
        out.token_logprobs.append(_clamp(chosen))
        out.top_logprobs.append(top)
    return out, offset


def _top(token: str, logprob: float) -> TopLogprob:
    return TopLogprob(token=token, logprob=_clamp(logprob), bytes=list(token.encode("utf-8")))


def chat_logprobs(
    token_ids: list[int], entries: list[EngineLogprob], texts: TokenTexts
) -> list[TokenLogprob]:
    content = []
    for token_id, (chosen, alternatives) in zip(token_ids, entries):
        token = texts(token_id)
        content.append(
            TokenLogprob(
                token=token,
                logprob=_clamp(chosen),
                bytes=list(token.encode("utf-8")),
                top_logprobs=[_top(texts(t), lp) for t, lp in alternatives],
            )
        )
    return content
