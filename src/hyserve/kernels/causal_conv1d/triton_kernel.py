"""Varlen causal depthwise conv1d + SiLU over packed sequences, with conv states in slots; no host sync.

Shapes: x [T, D] (model dtype, last dim contiguous), weight [D, W], conv_state [S, W-1, D] (oldest row
first), cu_seqlens [N+1], state_indices [N], has_initial_state [N] -> out [T, D] in x's dtype.

Grid (token blocks, D/BD): sequences are cut into blocks of BT tokens; the grid is the upper bound
T/BT + N and each program finds its (sequence, block) from cu_seqlens in registers (vector load +
cumsum), programs past the last block exit. A program computes y[t] = sum_w weight[:, w] * in[t-W+1+w]
as W shifted [BT, BD] loads (they overlap, L1/L2 serve the repeats), each row pointing into x or, for
positions before the sequence start, into the slot (has_initial_state) or masked to zero; SiLU in fp32.
A block whose taps all lie inside its sequence, with D a multiple of BD (every block of a long prompt but the
first and the last), loads the W shifted tiles straight from x with no row select and no masks: the same
values in the same order, so the output is bit-identical (``interior_fast_path=False`` turns it off). The
general path's per-element selects and masks made the kernel instruction-bound (H200, 1024 tokens: SM 53%,
DRAM 19%, 19.9 us for ~8 us of bytes; docs/performance.md); with the fast path the plan's tile (BT 32, BD 128,
4 warps) takes 17.5 us at 1024 tokens (19.1 without) and 55.8 us at 4096 (63.3), the fastest of the six tiles
``scripts/ncu_prefill_kernels.py --conv-sweep`` timed both ways. BT must be at least W - 1 (see below).

With ``gates`` the grid has one more column (the first): its programs compute the Gated DeltaNet's prefill gates
(``gdn_gating``, through its own ``gates_rows``) for their block's tokens instead of the conv, which saves that
op's launch; the gates are per token, so the conv's (sequence, block) cut covers every token once.

Conv state: the new state is the last W-1 inputs of (history ++ tokens), so for a sequence shorter than
W-1 it still holds old history rows. Only the first block of a sequence reads the history, so that
program writes the new state (after a CTA barrier, rows in increasing order: row r takes old row L + r
>= r + 1, never one already overwritten) and no other program touches the slot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.contracts import require
from hyserve.kernels.gdn_gating.triton_kernel import gates_rows

_CONFIG = {"BT": 32, "BD": 128, "num_warps": 4}


@triton.jit(do_not_specialize=["N"])  # the sequence count changes every step: one variant for all
def _conv_prefill_kernel(
    x_ptr, w_ptr, cs_ptr, cu_ptr, idx_ptr, init_ptr, out_ptr, a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, g_ptr, beta_ptr,
    N, D, stride_xt, stride_ot, stride_at, stride_bt,
    W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, EVEN_D: tl.constexpr, FAST: tl.constexpr,
    GATES: tl.constexpr, HV: tl.constexpr, HP: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    i_d = tl.program_id(1)
    # (sequence, block within it) of block pid, blocks numbered sequence by sequence
    i = tl.arange(0, BN)
    lo = tl.load(cu_ptr + i, mask=i < N, other=0).to(tl.int32)
    hi = tl.load(cu_ptr + i + 1, mask=i < N, other=0).to(tl.int32)
    cnt = (hi - lo + BT - 1) // BT
    ends = tl.cumsum(cnt, 0)
    if pid >= tl.sum(cnt, 0):
        return
    seq = tl.sum((ends <= pid).to(tl.int32), 0)
    blk = pid - tl.sum(tl.where(i == seq, ends - cnt, 0), 0)
    start = tl.load(cu_ptr + seq).to(tl.int32)
    end = tl.load(cu_ptr + seq + 1).to(tl.int32)
    slot = tl.load(idx_ptr + seq).to(tl.int64)
    n_hist = tl.where(tl.load(init_ptr + seq) != 0, W - 1, 0)  # history rows to read: all or none
    X_DT = x_ptr.dtype.element_ty

    rows = start + blk * BT + tl.arange(0, BT)
    mr = rows < end
    if GATES:
        # column 0 computes the DeltaNet gates of this block's tokens: scheduled first, it runs beside the conv
        # programs instead of in the launch's tail
        if i_d == 0:
            gates_rows(a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, rows.to(tl.int64), mr, stride_at,
                       stride_bt, HV, HP)  # fmt: skip
            return
        i_d -= 1
    cols = i_d * BD + tl.arange(0, BD)
    mc = cols < D
    s_base = cs_ptr + slot * (W - 1) * D
    acc = tl.zeros((BT, BD), tl.float32)
    # a block whose taps all lie inside its sequence, whole D tiles: plain shifted tiles of x (module docstring)
    interior = (blk * BT >= W - 1) & (start + blk * BT + BT <= end)
    if interior & FAST & EVEN_D:
        base = x_ptr + rows.to(tl.int64)[:, None] * stride_xt + cols[None, :]
        for w in tl.static_range(W):
            xin = tl.load(base + (w - (W - 1)) * stride_xt)
            wt = tl.load(w_ptr + cols * W + w).to(tl.float32)
            acc += xin.to(tl.float32) * wt[None, :]
    else:
        for w in tl.static_range(W):
            p = rows - (W - 1) + w  # input position of tap w
            hist_row = p - start + (W - 1)  # row of the old state for positions before the start
            # one load per tap: row pointers into x, or into the slot for positions before the start
            row_ptr = tl.where(p >= start, x_ptr + p.to(tl.int64) * stride_xt, s_base + hist_row * D)
            ok_row = mr & ((p >= start) | (hist_row < n_hist))
            xin = tl.load(row_ptr[:, None] + cols[None, :], mask=ok_row[:, None] & mc[None, :], other=0.0)
            wt = tl.load(w_ptr + cols * W + w, mask=mc, other=0.0).to(tl.float32)
            acc += xin.to(tl.float32) * wt[None, :]
    y = acc * tl.sigmoid(acc)
    tl.store(
        out_ptr + rows.to(tl.int64)[:, None] * stride_ot + cols[None, :],
        y.to(out_ptr.dtype.element_ty),
        mask=mr[:, None] & mc[None, :],
    )

    if blk == 0:  # the only program that read this slot: write its new state
        length = end - start
        for r in tl.static_range(W - 1):
            pos = end - (W - 1) + r
            # (scalar conditions folded into column bounds: vector & scalar masks trip the interpreter)
            xr = tl.load(
                x_ptr + pos.to(tl.int64) * stride_xt + cols,
                mask=cols < tl.where(pos >= start, D, 0),
                other=0.0,
            )
            old = length + r  # old-state row feeding new row r when pos < start (old > r: not yet written)
            h_cols = tl.where((pos < start) & (old < n_hist), D, 0)
            hr = tl.load(s_base + old * D + cols, mask=cols < h_cols, other=0.0).to(X_DT)
            val = tl.where(pos >= start, xr, hr)
            tl.debug_barrier()  # all reads of the slot (above, and the conv's) before this write
            tl.store(s_base + r * D + cols, val.to(cs_ptr.dtype.element_ty), mask=mc)


def _as_int8(flags: torch.Tensor) -> torch.Tensor:
    """bool -> int8 without a copy kernel (same item size)."""
    return flags.view(torch.int8) if flags.dtype == torch.bool else flags.to(torch.int8)


def causal_conv1d_prefill_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    block_t: int | None = None,
    block_d: int | None = None,
    num_warps: int | None = None,
    out: torch.Tensor | None = None,
    interior_fast_path: bool = True,
    gates: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as ``causal_conv1d_prefill_reference``; the keyword arguments override the config,
    ``out`` [T, D] (last dim contiguous) receives the result (else allocated). ``interior_fast_path=False``
    sends every block through the general path (A/B timing; the output is bit-identical).

    ``gates`` (a, b [T, HV] with unit head stride, A_log, dt_bias [HV] contiguous): one more column of programs
    computes ``gdn_gating``'s g [T, HV] fp32 and beta [T, HV] (b's dtype) of its block's tokens, with the same
    code (the same bits), and the call returns (out, g, beta): the DeltaNet prefill's gates without a launch."""
    t, d = x.shape
    width = weight.shape[-1]
    n = state_indices.shape[0]
    require(
        x.stride(-1) == 1 and conv_state.is_contiguous() and conv_state.shape[1:] == (width - 1, d),
        "causal_conv1d_prefill: x needs a contiguous last dim, conv_state must be contiguous [S, W-1, D]",
    )
    # one load per tap reads x or the slot
    require(conv_state.dtype == x.dtype, "causal_conv1d_prefill: conv_state must have x's dtype")
    out = torch.empty_like(x) if out is None else out
    if gates is not None:
        a, b, a_log, dt_bias = gates
        require(
            a.shape == b.shape and a.shape[0] == t and a.stride(1) == 1 and b.stride(1) == 1
            and a_log.is_contiguous() and dt_bias.is_contiguous(),
            "causal_conv1d_prefill: the gates' a, b must be [T, HV] with unit head stride, A_log and dt_bias "
            "contiguous",
        )  # fmt: skip
        hv = a.shape[1]
        g = torch.empty((t, hv), dtype=torch.float32, device=x.device)
        beta = torch.empty((t, hv), dtype=b.dtype, device=x.device)
    if t == 0 or n == 0:
        return out if gates is None else (out, g, beta)
    weight = weight.reshape(d, width)
    weight = weight if weight.is_contiguous() else weight.contiguous()
    bt = block_t or _CONFIG["BT"]
    if bt < width - 1:  # block 1 would read history rows that block 0 is overwriting with the new state
        raise ValueError(f"block_t must be at least the conv width - 1 = {width - 1}, got {bt}")
    bd = min(block_d or _CONFIG["BD"], triton.next_power_of_2(d))
    bn = max(64, triton.next_power_of_2(n))  # one variant for up to 64 sequences (no compile mid-serving)
    if gates is None:
        gate_args, gate_strides, hv = (x,) * 6, (0, 0), 1  # (unused pointers)
    else:
        gate_args, gate_strides = (a, b, a_log, dt_bias, g, beta), (a.stride(0), b.stride(0))
    tiles_d = triton.cdiv(d, bd)
    _conv_prefill_kernel[(triton.cdiv(t, bt) + n, tiles_d + (gates is not None))](
        x, weight, conv_state, cu_seqlens, state_indices, _as_int8(has_initial_state), out, *gate_args,
        n, d, x.stride(0), out.stride(0), *gate_strides,
        W=width, BT=bt, BD=bd, BN=bn, EVEN_D=d % bd == 0, FAST=interior_fast_path,
        GATES=gates is not None, HV=hv, HP=triton.next_power_of_2(hv),
        num_warps=num_warps or _CONFIG["num_warps"],
    )  # fmt: skip
    return out if gates is None else (out, g, beta)
