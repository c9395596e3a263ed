"""Ticket counters of the last-program reductions (the fused MoE router, the DeltaNet decode step's head
tickets, ``logits_argmax``, the greedy head): zeroed int32 counters that every launch leaves at zero
(docs/kernels.md), and other state a launch leaves as it found it (``kernel_state``).

Each kernel owns its counters (two kernels can be resident at once under PDL). They are allocated outside any
CUDA-graph capture: a tensor first allocated while capturing lives in the graphs' shared memory pool, where
another graph's temporaries may overwrite it between replays (a garbage count; seen on the H200 as an illegal
address at batch 1 after a c=32 run). The engine runs every batch size eagerly before capturing, so counters
grow only then; one that is outgrown stays allocated, since graphs captured before may still use it. Launches on
two streams at once would share them; the engine runs one stream.
"""

from __future__ import annotations

import torch

_COUNTERS: dict[tuple[str, str], torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []


def ticket_counters(owner: str, device: torch.device, n: int, minimum: int = 1) -> torch.Tensor:
    """At least ``n`` zeroed int32 counters of ``owner``'s kernel on ``device`` (the same tensor on every call
    until ``n`` outgrows it; a new one holds at least ``minimum``). Raises RuntimeError when it would have to be
    allocated inside a CUDA-graph capture."""
    return kernel_state(owner, device, n, minimum=minimum)


def kernel_state(
    owner: str,
    device: torch.device,
    n: int,
    dtype: torch.dtype = torch.int32,
    fill: int = 0,
    minimum: int = 1,
) -> torch.Tensor:
    """``ticket_counters`` for any state a kernel leaves as it found it: at least ``n`` values of ``dtype``,
    ``fill`` when allocated (e.g. the identity of an atomic max)."""
    key = (owner, str(device))
    c = _COUNTERS.get(key)
    if c is None or c.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"the state of {owner} ({n}) must be allocated before CUDA-graph capture: run that batch size "
                "eagerly first"
            )
        if c is not None:
            _OUTGROWN.append(c)
        c = _COUNTERS[key] = torch.full((max(n, minimum),), fill, dtype=dtype, device=device)
    return c
