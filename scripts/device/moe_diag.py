"""Where the grouped gate_up's time above its weight-read floor goes at 1024 tokens: the TMA plan of before
ef65e85 (block_m 64, BLOCK_I = BLOCK_K = 64, 4 warps, 4 stages; 3 stages since) as a copy of
``_gate_up_kernel``'s TMA path, timed alone (CUDA graph, L2 flushed, as ``moe.tune``) with parts of its loop taken out:

  full     the kernel's loop: gathered x tile + two TMA weight tiles + two wgmma a K step
  no_x     the x tile gathered once, before the loop, and reused (the weights and the dots stay)
  no_dot   the tiles loaded as before but added elementwise into the accumulators (no tensor cores)
  stream   no_x and no_dot: the weights' TMA stream alone
  one_dot  full with the gate and up tiles in one [2, BLOCK_I, BLOCK_K] box (a 3-D descriptor over the weights
           viewed as [2E, I, H]) and one dot of N = 2 BLOCK_I; its h is checked against full's

The outputs of the variants are meaningless; only their times are compared. If ``no_x`` is at the floor the
gathered x rows (L2 traffic, address math) cost the difference; if ``no_dot`` is, the dots do. Every block runs
one loop through the routed experts' descriptor (the shared expert's blocks read other rows, as many bytes):
with a second loop for the shared descriptor the two loops' buffers were not shared (196 KB of shared memory,
one CTA an SM, in the first runs). The copies' x loads pipeline through cp.async where the kernel's do not (98
against 74 KB: two CTAs an SM against three), so compare the variants with each other, not with the kernel.

usage: python3 scripts/device/moe_diag.py [--tokens 128,1024]
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from hyserve.kernels.moe import tune as t
from hyserve.kernels.moe.bench import moved_bytes
from hyserve.kernels.moe.routing import block_rows

VARIANTS = {
    "full": (0, 0, 0),
    "no_x": (1, 0, 0),
    "no_dot": (0, 1, 0),
    "stream": (1, 1, 0),
    "one_dot": (0, 0, 1),
}  # NO_X, NO_DOT, ONE_DOT


@triton.jit
def _loop(desc, row_g, row_u, x_rows, rmask, kk, H, BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr,
          BLOCK_K: tl.constexpr, STAGES: tl.constexpr, NO_X: tl.constexpr, NO_DOT: tl.constexpr):  # fmt: skip
    acc_g = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    if NO_X:
        x0 = tl.load(x_rows[:, None] + kk[None, :], mask=rmask[:, None], other=0.0)
    for k0 in tl.range(0, H, BLOCK_K, num_stages=STAGES):
        if NO_X:
            xt = x0
        else:
            xt = tl.load(x_rows[:, None] + (k0 + kk)[None, :], mask=rmask[:, None], other=0.0)
        wg = desc.load([row_g, k0])
        wu = desc.load([row_u, k0])
        if NO_DOT:  # [BLOCK_M, BLOCK_I] = [BLOCK_K, BLOCK_K] here: the tiles added as they are
            acc_g += xt.to(tl.float32) + wg.to(tl.float32)
            acc_u += wu.to(tl.float32)
        else:
            acc_g = tl.dot(xt, wg.T, acc_g)
            acc_u = tl.dot(xt, wu.T, acc_u)
    return acc_g, acc_u


@triton.jit
def _loop_one_dot(desc3, blk, col, x_rows, rmask, kk, H, BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr,
                  BLOCK_K: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    """gate and up rows [col, +BLOCK_I) of block pair (blk, blk + 1) in one box and one dot: acc [BLOCK_M, 2 BLOCK_I]."""
    acc = tl.zeros((BLOCK_M, 2 * BLOCK_I), dtype=tl.float32)
    for k0 in tl.range(0, H, BLOCK_K, num_stages=STAGES):
        xt = tl.load(x_rows[:, None] + (k0 + kk)[None, :], mask=rmask[:, None], other=0.0)
        w2 = tl.reshape(desc3.load([blk, col, k0]), (2 * BLOCK_I, BLOCK_K))
        acc = tl.dot(xt, w2.T, acc)
    return acc


@triton.jit
def _diag_kernel(
    x_ptr, w_desc, w_desc3, sorted_ptr, meta_ptr, h_ptr, N, H, I, E, MAXB, stride_xt,
    K_TOP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr, NO_X: tl.constexpr, NO_DOT: tl.constexpr, ONE_DOT: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0)
    b = tl.program_id(1)
    if b >= tl.load(meta_ptr + 3 * MAXB):
        return
    e, _, pos, rmask, routed, pair = block_rows(meta_ptr, sorted_ptr, b, N, E, MAXB, BLOCK_M)
    tok = tl.where(pos >= N, pos - N, pair // K_TOP)
    tok = tl.where(rmask, tok, 0).to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + tok * stride_xt
    # one loop for every block, the shared expert's too through the routed descriptor (its rows are the wrong
    # weights, the same bytes): two loops, one a descriptor, would not share their buffers (1 CTA an SM)
    if ONE_DOT:
        acc = _loop_one_dot(w_desc3, 2 * (e.to(tl.int32) % E), n * BLOCK_I, x_rows, rmask, kk, H, BLOCK_M, BLOCK_I,
                            BLOCK_K, STAGES)  # fmt: skip
        acc_g, acc_u = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_I)), (0, 2, 1)))
    else:
        row = e.to(tl.int32) % E * (2 * I) + n * BLOCK_I
        acc_g, acc_u = _loop(w_desc, row, row + I, x_rows, rmask, kk, H, BLOCK_M, BLOCK_I, BLOCK_K, STAGES, NO_X,
                             NO_DOT)  # fmt: skip
    ii = n * BLOCK_I + tl.arange(0, BLOCK_I)
    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(
        h_ptr + pos[:, None].to(tl.int64) * I + ii[None, :], h.to(h_ptr.dtype.element_ty), mask=rmask[:, None]
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="128,1024")
    a = ap.parse_args()
    layer = t.make_inputs(init=True)
    bm, bi, bk, warps, stages = 64, 64, 64, 4, 4
    wgu = layer["w_gate_up"]
    desc = TensorDescriptor.from_tensor(wgu.view(t.E * 2 * t.I, t.H), [bi, bk])
    desc3 = TensorDescriptor.from_tensor(wgu.view(t.E * 2, t.I, t.H), [2, bi, bk])
    for T in (int(v) for v in a.tokens.split(",")):
        x = t.make_x(T, init=True)
        experts = moved_bytes(x, layer, t.TOP_K)[1] + 1  # the routed ones touched, and the shared one
        floor_us = experts * 2 * t.I * t.H * 2 / 4.0e6
        rt = t.route(layer, x, bm)
        n = T * t.TOP_K
        h = torch.zeros((n + T, t.I), dtype=x.dtype, device=x.device)
        ref = t.time_graph(lambda rt=rt, x=x: t.run_gate_up(layer, x, rt, bm, dict(BLOCK_I=bi, BLOCK_K=bk,
                           num_warps=warps, num_stages=stages, TMA=1)))  # fmt: skip
        print(
            f"T={T}: {experts} experts, weight floor {floor_us:.1f} us at 4.0 TB/s; the kernel {ref * 1e3:.1f} us"
        )
        full = None
        for name, (no_x, no_dot, one_dot) in VARIANTS.items():

            def run(rt=rt, x=x, h=h, n=n, no_x=no_x, no_dot=no_dot, one_dot=one_dot):
                _diag_kernel[(triton.cdiv(t.I, bi), rt.max_blocks)](
                    x, desc, desc3, rt.sorted_pairs, rt.meta, h, n, t.H, t.I, t.E, rt.max_blocks, x.stride(0),
                    K_TOP=t.TOP_K, BLOCK_M=bm, BLOCK_I=bi, BLOCK_K=bk, STAGES=stages, NO_X=no_x, NO_DOT=no_dot,
                    ONE_DOT=one_dot, num_warps=warps, num_stages=stages,
                )  # fmt: skip

            ms = t.time_graph(run)
            note = ""
            if name == "full":
                full = h.float().clone()
            elif one_dot:  # the same products and sums: the h rows should agree bit for bit
                note = f", relative difference from full's h {((h.float() - full).norm() / full.norm()).item():.2e}"
            print(
                f"  {name:7s} {ms * 1e3:7.1f} us  ({floor_us / (ms * 1e3):.0%} of the floor's rate){note}",
                flush=True,
            )


if __name__ == "__main__":
    main()
