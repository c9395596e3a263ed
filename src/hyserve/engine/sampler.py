"""Turning logits into tokens on the device: penalties, temperature, top-k/top-p/min-p, seeded sampling.

Sampling uses the exponential race ``argmax(p / q), q ~ Exp(1)``, which draws from ``p`` exactly. A request
with a seed draws its noise from a generator seeded by (seed, choice index, output position), so its tokens
do not depend on what else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hyserve.engine.sequence import Sequence
from hyserve.kernels.copy_words import copy_words

_SEED_STRIDE = 1_000_003


@dataclass
class SamplerOutput:
    token_ids: list[int]  # [N] one per sampled sequence
    logprobs: list[float] | None  # [N] logprob of the chosen token under the raw model distribution
    top_logprobs: list[list[tuple[int, float]]] | None  # [N][k] top alternatives (raw distribution)


@dataclass
class DeviceSample:
    """A sampling result still on the device, so the next step can be launched before the host reads it."""

    tokens: torch.Tensor  # [N] int64
    logprobs: torch.Tensor | None = None  # [N] fp32 chosen-token logprobs
    top_values: torch.Tensor | None = None  # [N, k] fp32
    top_ids: torch.Tensor | None = None  # [N, k] int64
    _host: list[torch.Tensor | None] | None = None  # pinned copies of the four fields, once queued
    _ready: torch.cuda.Event | None = None  # recorded after those copies

    def start_copy(self) -> None:
        """Queue the copy to pinned host memory now, right behind the step that sampled.

        With async scheduling the next step is launched before the host reads this one; a plain
        ``.tolist()`` at read time would queue its copy behind that next step and so wait for it too, and
        the GPU would then idle while the host processes the tokens and launches the step after."""
        if not self.tokens.is_cuda or self._ready is not None:
            return
        self._host = [
            None if t is None else _to_pinned(t)
            for t in (self.tokens, self.logprobs, self.top_values, self.top_ids)
        ]
        self._ready = torch.cuda.Event()
        self._ready.record()

    def to_host(self, seqs: list[Sequence]) -> SamplerOutput:
        fields = [self.tokens, self.logprobs, self.top_values, self.top_ids]
        if self._ready is not None:
            self._ready.synchronize()  # this step's copies only (releases the GIL while it waits)
            fields = self._host
        tokens_t, logprobs_t, values_t, ids_t = fields
        tokens = tokens_t.tolist()
        if logprobs_t is None:
            return SamplerOutput(tokens, None, None)
        top: list[list[tuple[int, float]]] = [[] for _ in seqs]
        if values_t is not None:
            for i, (v, t) in enumerate(zip(values_t.tolist(), ids_t.tolist())):
                k = seqs[i].params.logprobs or 0
                top[i] = list(zip(t[:k], v[:k]))
        return SamplerOutput(tokens, logprobs_t.tolist(), top)


def _to_pinned(t: torch.Tensor) -> torch.Tensor:
    """A pinned host copy of t, queued: written by a kernel (``copy_words``: no copy-engine hop between two
    decode steps) when t is contiguous, else by the copy engine."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    if t.is_contiguous():
        return copy_words(t, host)
    return host.copy_(t, non_blocking=True)


def writes_logits(seq: Sequence, offset: int = 0) -> bool:
    """Whether sampling this sequence changes its logits row: penalties, or stop tokens masked before
    ``min_tokens`` (``_penalise``, ``_mask_stops_before_min_tokens``)."""
    return seq.params.needs_penalties or len(seq.output_token_ids) + offset < seq.params.min_tokens


def _penalise(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    for row, seq in enumerate(seqs):
        p = seq.params
        if not p.needs_penalties:
            continue
        vocab = logits.shape[1]
        device = logits.device
        if p.repetition_penalty != 1.0:
            seen = (
                torch.tensor(seq.all_token_ids, dtype=torch.long, device=device).clamp_(0, vocab - 1).unique()
            )
            values = logits[row, seen]
            logits[row, seen] = torch.where(
                values > 0, values / p.repetition_penalty, values * p.repetition_penalty
            )
        if (p.presence_penalty or p.frequency_penalty) and seq.output_token_ids:
            out = torch.tensor(seq.output_token_ids, dtype=torch.long, device=device).clamp_(0, vocab - 1)
            counts = torch.zeros(vocab, dtype=logits.dtype, device=device).index_add_(
                0, out, torch.ones_like(out, dtype=logits.dtype)
            )
            logits[row] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def _mask_stops_before_min_tokens(
    logits: torch.Tensor, seqs: list[Sequence], eos_ids: tuple[int, ...], offset: int
) -> None:
    for row, seq in enumerate(seqs):
        p = seq.params
        if len(seq.output_token_ids) + offset < p.min_tokens:
            banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_ids))
            banned = [t for t in banned if 0 <= t < logits.shape[1]]
            if banned:
                logits[row, banned] = float("-inf")


def _filter(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Top-k, top-p and min-p filters on temperature-scaled logits [N, V] (rows that ask for them)."""
    rows = [
        i for i, s in enumerate(seqs) if s.params.top_k > 0 or s.params.top_p < 1.0 or s.params.min_p > 0.0
    ]
    if not rows:
        return logits
    vocab = logits.shape[1]
    device = logits.device
    sub = logits[rows]
    top_k = torch.tensor(
        [seqs[i].params.top_k if seqs[i].params.top_k > 0 else vocab for i in rows], device=device
    )
    top_p = torch.tensor([seqs[i].params.top_p for i in rows], device=device, dtype=torch.float32)
    min_p = torch.tensor([seqs[i].params.min_p for i in rows], device=device, dtype=torch.float32)
    sorted_logits, order = sub.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=device)[None, :]
    remove = rank >= top_k.clamp(max=vocab)[:, None]
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(-1)
    # keep the smallest prefix whose mass reaches top_p (the token crossing it stays)
    mass_before = probs.cumsum(-1) - probs
    remove |= mass_before >= top_p[:, None]
    remove |= probs < min_p[:, None] * probs[:, :1]
    remove[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    logits[rows] = torch.empty_like(sub).scatter_(1, order, sorted_logits)
    return logits


def sample_on_device(
    logits: torch.Tensor,
    seqs: list[Sequence],
    eos_ids: tuple[int, ...],
    num_logprobs: int | None,
    offset: int = 0,
) -> DeviceSample:
    """logits: [N, V] fp32, one row per sequence in ``seqs``. ``num_logprobs``: the most alternatives any
    of these sequences asked for (None: no logprobs at all). ``offset``: tokens each sequence has generated
    beyond ``output_token_ids`` (1 when this step was launched before the host saw the previous token)."""
    raw = logits
    if any(writes_logits(s, offset) for s in seqs):  # raw stays for the logprobs
        logits = logits.clone()
    _penalise(logits, seqs)
    _mask_stops_before_min_tokens(logits, seqs, eos_ids, offset)
    greedy_rows = [s.params.greedy for s in seqs]
    tokens = logits.argmax(-1)
    if not all(greedy_rows):
        temps = torch.tensor([max(s.params.temperature, 1e-5) for s in seqs], device=logits.device)
        scaled = _filter(logits / temps[:, None], seqs)
        probs = scaled.softmax(-1)
        noise = torch.empty_like(probs)
        unseeded = [i for i, s in enumerate(seqs) if s.params.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty_like(probs[unseeded]).exponential_()
        for i, s in enumerate(seqs):
            if s.params.seed is not None:
                step = len(s.output_token_ids) + offset
                seed = (s.params.seed * _SEED_STRIDE + s.index) * _SEED_STRIDE + step
                gen = torch.Generator(device=logits.device).manual_seed(seed % (2**63))
                noise[i] = torch.empty_like(probs[i]).exponential_(generator=gen)
        sampled = (probs / noise).argmax(-1)
        greedy = torch.tensor(greedy_rows, device=logits.device)
        tokens = torch.where(greedy, tokens, sampled)
    if num_logprobs is None:
        return DeviceSample(tokens)
    logprobs = raw.log_softmax(-1)
    chosen = logprobs.gather(1, tokens[:, None])[:, 0]
    if num_logprobs > 0:
        values, ids = logprobs.topk(num_logprobs, dim=-1)
        return DeviceSample(tokens, chosen, values, ids)
    return DeviceSample(tokens, chosen)


def sample(
    logits: torch.Tensor, seqs: list[Sequence], eos_ids: tuple[int, ...], num_logprobs: int | None
) -> SamplerOutput:
    """``sample_on_device`` read back to the host."""
    return sample_on_device(logits, seqs, eos_ids, num_logprobs).to_host(seqs)
