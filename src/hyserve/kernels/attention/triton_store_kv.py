"""Scatter of the new tokens' K/V into the paged cache.

Shapes: k, v [T, Hkv, D] (any token/head strides, unit dim stride); k_cache, v_cache
[num_blocks, PAGE, Hkv, D]; slot_mapping [T] int64, flat slot ``block * PAGE + offset``; negative = skip.
Grid: (T,): a program copies one token's [Hkv, D] tile of K and of V (masked store when the slot is < 0, so
padding tokens of a CUDA-graph batch write nothing). Values are cast to the cache dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.pdl import launch_options, wait_for_previous


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    # the slot mapping is a step input (copied in before the step's first kernel, kernels/pdl.py): it loads
    # while the previous kernel finishes, so the K/V loads it masks do not wait for it after the wait
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    wait_for_previous(USE_PDL)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    num_h = tl.where(slot >= 0, H, 0)  # a negative slot masks every head
    mask = (offs_h[:, None] < num_h) & (offs_d[None, :] < D)
    safe = tl.maximum(slot, 0)
    blk = safe // PAGE
    off = safe % PAGE
    k = tl.load(k_ptr + tok * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    kc = k_cache_ptr + blk * stride_kcb + off * stride_kcs + offs_h[:, None] * stride_kch + offs_d[None, :]
    vc = v_cache_ptr + blk * stride_vcb + off * stride_vcs + offs_h[:, None] * stride_vch + offs_d[None, :]
    tl.store(kc, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv_triton(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v: [T, Hkv, D] -> the cache slots ``slot_mapping`` [T] (negative slots skipped)."""
    num_tokens, num_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        H=num_heads, D=head_dim, BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_D=triton.next_power_of_2(head_dim), PAGE=k_cache.shape[1],
        num_warps=4, **launch_options(k),
    )  # fmt: skip
