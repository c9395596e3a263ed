"""Recurrent gated delta rule for one new token per sequence, state updated in place in its slot.

Shapes: q, k [B, H, K], v [B, HV, V] (any batch/head strides, last dim contiguous), g [B, HV] fp32
log-decay, beta [B, HV], state [S, HV, K, V] fp32 contiguous, state_indices [B] -> o [B, HV, V].

Grid (B, HV, V/BV): each program owns the [K, BV] fp32 tile of one (sequence, value head); it streams
the tile in and out once (the 2 MB per sequence and layer that bound decode) and recomputes the L2 norms
of its key head's q and k (K elements: cheap, and no cross-program traffic). The K reduction
(S^T k, S^T q) stays inside the program, so tiles never talk to each other; BV only trades the number of
programs (B=1 wants >= 128 of them) against per-program overhead, picked by batch size below.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.contracts import require

# batch size -> (BV, num_warps); the first entry whose bound is >= B
_CONFIGS = ((4, 32, 4), (1 << 30, 64, 4))


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, idx_ptr, o_ptr,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_gb, stride_bb, stride_ob, stride_oh,
    scale,
    HV: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    i_b = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // G
    b64 = i_b.to(tl.int64)
    slot = tl.load(idx_ptr + i_b).to(tl.int64)
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < K
    mv = ov < V
    s_off = ((slot * HV + i_hv) * K + ok[:, None]) * V + ov[None, :]
    EVEN: tl.constexpr = (K == BK) and (V % BV == 0)  # no masks: lets the compiler vectorise the tile
    if EVEN:
        s = tl.load(state_ptr + s_off)  # issued first: the long pole
    else:
        s = tl.load(state_ptr + s_off, mask=mk[:, None] & mv[None, :], other=0.0)

    q = tl.load(q_ptr + b64 * stride_qb + i_h * stride_qh + ok, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + b64 * stride_kb + i_h * stride_kh + ok, mask=mk, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + b64 * stride_vb + i_hv * stride_vh + ov, mask=mv, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + b64 * stride_gb + i_hv).to(tl.float32)
    beta = tl.load(beta_ptr + b64 * stride_bb + i_hv).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)

    s = s * tl.exp(g)
    delta = (v - tl.sum(s * k[:, None], 0)) * beta
    s = s + k[:, None] * delta[None, :]
    if EVEN:
        tl.store(state_ptr + s_off, s)
    else:
        tl.store(state_ptr + s_off, s, mask=mk[:, None] & mv[None, :])
    o = tl.sum(s * q[:, None], 0)
    tl.store(o_ptr + b64 * stride_ob + i_hv * stride_oh + ov, o.to(o_ptr.dtype.element_ty), mask=mv)


def decode_config(batch: int) -> tuple[int, int]:
    for bound, bv, warps in _CONFIGS:
        if batch <= bound:
            return bv, warps
    raise AssertionError


def require_delta_rule_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor) -> None:
    """What the decode and prefill kernels assume of q, k [.., H, K], v [.., HV, V] and the state."""
    require(
        q.stride(-1) == k.stride(-1) == v.stride(-1) == 1 and state.is_contiguous(),
        "gated delta rule: q, k, v need a contiguous last dim and the state must be contiguous",
    )
    require(
        state.dtype == torch.float32 and v.shape[-2] % q.shape[-2] == 0,
        "gated delta rule: the state must be fp32, and the value heads a multiple of the key heads",
    )


def gated_delta_rule_decode_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    block_v: int | None = None,
    num_warps: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as ``gated_delta_rule_decode_reference``; ``block_v``/``num_warps`` override the config,
    ``out`` [B, HV, V] contiguous receives o (else allocated)."""
    b, h, kd = q.shape
    hv, vd = v.shape[1], v.shape[2]
    require_delta_rule_inputs(q, k, v, state)
    if out is None:
        out = torch.empty((b, hv, vd), device=v.device, dtype=v.dtype)
    require(out.is_contiguous(), "gated_delta_rule_decode: out must be contiguous")
    if b == 0:
        return out
    g = g if g.stride(-1) == 1 else g.contiguous()
    beta = beta if beta.stride(-1) == 1 else beta.contiguous()
    bv, warps = decode_config(b)
    bk, bvf = max(16, triton.next_power_of_2(kd)), max(16, triton.next_power_of_2(vd))
    bv = min(block_v or bv, bvf)
    _decode_kernel[(b, hv, triton.cdiv(vd, bv))](
        q, k, v, g, beta, state, state_indices, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
        out.stride(0), out.stride(1), kd**-0.5,
        HV=hv, G=hv // h, K=kd, V=vd, BK=bk, BV=bv, num_warps=num_warps or warps,
    )  # fmt: skip
    return out
