"""Upcast + argmax of the logits in one launch, with a last-program reduction.

Shapes: x [N, V] (unit column stride, any row stride) -> logits [N, V] fp32, ids [N] int64.
Grid: (S = cdiv(V, BLOCK), N); program (s, r) takes columns [s*BLOCK, (s+1)*BLOCK) of row r: it writes them as
fp32 and its best column as one int64 key into ``partial [N, S]``, then draws a ticket of row r's counter; the
program that draws the row's last one reduces the row's S keys and resets the counter to 0.

The key orders (value, column) in one integer, so a max of keys is an argmax with torch's tie rule (the
first of equal maxima): the high 32 bits are the fp32 value's bits made order-preserving as a signed integer
(negative values have their magnitude bits flipped; NaN maps to the largest key, as torch's argmax picks
NaN; -0.0 is +0.0 first), the low 32 bits ``2^32 - 1 - column``, larger for an earlier column.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.pdl import launch_options, wait_for_previous
from hyserve.kernels.tickets import ticket_counters

BLOCK = 2048  # columns a program takes: 122 programs over the 248k vocabulary


@triton.jit
def _ordered(v):
    """fp32 -> int32 whose signed order is v's order (negative values get their magnitude bits flipped; the
    flip is its own inverse, ``_unordered``)."""
    bits = v.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _unordered(key):
    """The fp32 of an ``_ordered`` key."""
    return tl.where(key < 0, key ^ 0x7FFFFFFF, key).to(tl.float32, bitcast=True)


@triton.jit
def _keys(v, cols):
    """v [BLOCK] fp32 at columns cols [BLOCK] -> their int64 keys (see the module docstring)."""
    v = v + 0.0  # -0.0 -> +0.0
    ordered = tl.where(v != v, 0x7FFFFFFF, _ordered(v))
    return (ordered.to(tl.int64) << 32) | (4294967295 - cols.to(tl.int64))


@triton.jit
def _logits_argmax_kernel(
    x_ptr,
    out_ptr,
    partial_ptr,
    ids_ptr,
    counter_ptr,
    V,
    stride_x,
    BLOCK: tl.constexpr,
    S_PAD: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    cols = pid * BLOCK + tl.arange(0, BLOCK)
    ok = cols < V
    wait_for_previous(USE_PDL)  # x is the LM head's output
    v = tl.load(x_ptr + r * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + r * V + cols, v, mask=ok)
    key = tl.where(ok, _keys(v, cols), -(2**63) + 1)
    tl.store(partial_ptr + r * tl.num_programs(0) + pid, tl.max(key, 0))
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr + r, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        s = tl.arange(0, S_PAD)
        keys = tl.load(
            partial_ptr + r * tl.num_programs(0) + s,
            mask=s < tl.num_programs(0),
            other=-(2**63) + 1,
            cache_modifier=".cg",
        )
        best = tl.max(keys, 0)
        tl.store(ids_ptr + r, 4294967295 - (best & 4294967295))
        tl.atomic_xchg(counter_ptr + r, 0, sem="relaxed", scope="gpu")


def logits_argmax_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``logits_argmax_reference``."""
    n, v = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty((n, v), dtype=torch.float32, device=x.device)
    ids = torch.empty(n, dtype=torch.int64, device=x.device)
    if n == 0:
        return out, ids
    programs = triton.cdiv(v, BLOCK)
    partial = torch.empty((n, programs), dtype=torch.int64, device=x.device)
    _logits_argmax_kernel[(programs, n)](
        x, out, partial, ids, ticket_counters("logits_argmax", x.device, n, minimum=1024), v, x.stride(0),
        BLOCK=BLOCK, S_PAD=triton.next_power_of_2(programs), num_warps=4, **launch_options(x),
    )  # fmt: skip
    return out, ids
