"""Bulk L2 prefetch (Hopper ``cp.async.bulk.prefetch.L2``) for the memory-bound decode kernels.

A decode step at batch 1 alternates bandwidth-bound kernels (the GEMV, the MoE experts) with latency-bound
ones (the DeltaNet step, the router, attention) during which HBM is nearly idle. Under PDL
(``kernels/pdl.py``) the next kernel's programs are resident before their wait; a program that asks the
L2 for its whole weight slice there turns that idle time into weight traffic, and its main loop then reads
from L2. Inside a bandwidth-bound kernel the same request, issued before the main loop, puts the whole slice
in flight at once instead of one tile per iteration.

One thread of the program issues the request: the data goes to L2, not to the program, so there is nothing
to wait for and no register is used. It is a hint: correctness never depends on it. The host enables it only
on CUDA devices of compute capability 9 or more (``enabled``); the CPU interpreter has no inline assembly.
Addresses must be 16-byte aligned and sizes multiples of 16 (``aligned``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def prefetch_l2(ptr, nbytes, ENABLED: tl.constexpr):
    """Ask the L2 to fetch ``nbytes`` (> 0, a multiple of 16) from ``ptr`` (16-byte aligned); thread 0 of the
    program issues it. A no-op unless ENABLED."""
    if ENABLED:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0;"
            " @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r",
            [ptr.to(tl.pointer_type(tl.int8)), nbytes.to(tl.int32)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@functools.cache
def _supported(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def enabled(t: torch.Tensor) -> bool:
    """Whether kernels on t's device can issue the prefetch: CUDA with compute capability >= 9."""
    if not t.is_cuda:
        return False
    return _supported(t.device.index if t.device.index is not None else torch.cuda.current_device())


def aligned(t: torch.Tensor, *row_bytes: int) -> bool:
    """Whether t's storage and the given byte counts (row lengths, strides) are 16-byte multiples."""
    return t.data_ptr() % 16 == 0 and all(b % 16 == 0 for b in row_bytes)
