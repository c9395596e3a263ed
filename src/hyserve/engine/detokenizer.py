"""Incremental detokenisation and stop-string handling for one sequence."""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text, never splitting a multi-byte character.

    ``text`` is everything decoded so far (cut at a stop string once one is found); ``visible_text`` holds
    back the tail that could still be the start of a stop string, so a stream never shows a partial stop.
    """

    def __init__(
        self, tokenizer: Any, stop: list[str], skip_special_tokens: bool, include_stop: bool
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.skip_special_tokens = skip_special_tokens
        self.include_stop = include_stop
        self.hold_back = max((len(s) for s in stop), default=1) - 1
        self.text = ""
        self._prefix_offset = 0
        self._read_offset = 0
        self.stopped_by: str | None = None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def update(self, token_ids: list[int]) -> str | None:
        """Decode up to ``token_ids`` (the whole output so far). Returns the stop string if one appeared."""
        if self.tokenizer is None or self.stopped_by is not None:
            return self.stopped_by
        prefix = self._decode(token_ids[self._prefix_offset : self._read_offset])
        full = self._decode(token_ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            start = max(0, len(self.text) - self.hold_back)
            self.text += full[len(prefix) :]
            self._prefix_offset, self._read_offset = self._read_offset, len(token_ids)
            for s in self.stop:
                at = self.text.find(s, start)
                if at >= 0:
                    self.text = self.text[: at + (len(s) if self.include_stop else 0)]
                    self.stopped_by = s
                    break
        return self.stopped_by

    def flush(self, token_ids: list[int]) -> None:
        """At the end of the sequence: decode whatever an incomplete character held back."""
        if self.tokenizer is None or self.stopped_by is not None:
            return
        full = self._decode(token_ids[self._prefix_offset :])
        prefix = self._decode(token_ids[self._prefix_offset : self._read_offset])
        if len(full) > len(prefix):
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset = len(token_ids)

    def visible_text(self, finished: bool) -> str:
        """The text that is safe to show: without a tail that may still grow into a stop string."""
        if finished or not self.stop:
            return self.text
        keep = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), keep, -1):
                if self.text.endswith(s[:k]):
                    keep = k
                    break
        return self.text[: len(self.text) - keep]
