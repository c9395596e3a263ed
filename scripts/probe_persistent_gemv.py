"""Probe: what one kernel boundary costs in the batch-1 decode chain, against a grid-wide barrier.

The B=1 decode step is ~270 dependent kernels; each streams little (2-50 MB) or is a short dependent chain,
and the gap to the floor is about their number times ~2-3 us of ramp-up and drain that PDL does not hide
(docs/performance.md, "Where the remaining time goes"). A persistent design (a layer, or the step, in one
launch) replaces each boundary by a barrier inside the kernel. Whether that is cheaper is the question this
probe answers before anyone builds one.

It times a chain of L dependent GEMVs, alternately [2048, 4096] and [4096, 2048] weights (16.8 MB each: the
out_proj shape and its transpose; L * 16.8 MB never fits the L2), x -> y_1 -> ... -> y_L, two ways:

- ``launches``: one ``gemv_triton`` launch per GEMV (the engine's kernel, PDL on), in a CUDA graph;
- ``persistent``: one launch of ``_chain_kernel``, grid = SMs x ``--programs-per-sm``, every program resident.
  For GEMV l a program takes row tiles grid-stride, then arrives at a grid-wide barrier (a CTA barrier, one
  release atomic add on a counter, then acquire polls until every program has arrived) before GEMV l + 1
  reads y_l. With ``--prefetch`` a program loads its first weight tile of GEMV l + 1 before it waits (what
  PDL does at a kernel boundary). The counter is zeroed by a memset node before the launch (counted).

Both are checked against a torch chain (fp32 products, each y rounded to the weights' dtype) first.
Prints us per GEMV for each, the weights' bytes over that time, and the difference per boundary.

    PYTHONPATH=src python3 scripts/probe_persistent_gemv.py [--layers 40] [--programs-per-sm 4]

On the CPU (``TRITON_INTERPRET=1``) it checks both on tiny shapes with one program and times nothing.
"""

from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl

from hyserve.kernels.gated_delta_rule.bench import time_ms
from hyserve.kernels.linear.triton_kernel import gemv_triton

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _grid_barrier(counter_ptr, target):
    """Every program arrives (its stores before a release add) and waits until ``target`` have arrived."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    polls = 0
    while (seen < target) & (polls < 1 << 24):  # bounded: a program that never came shows as a wrong result
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        polls += 1
    tl.debug_barrier()


@triton.jit
def _w_tile(w, rows, k, N, K, k_end):
    """The [rows, k] tile of a row-major W [N, K], zero outside it and at columns >= k_end."""
    return tl.load(
        w + rows[:, None] * K + k[None, :], mask=(rows < N)[:, None] & (k < k_end)[None, :], other=0.0
    )


@triton.jit
def _chain_kernel(
    act_ptr, w_ptr, counter_ptr, L, N0, K0, stride_act,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """act [L + 1, stride_act]: row 0 is x, row l + 1 receives y_{l+1} = W_l y_l; GEMV l has N = N0, K = K0
    when l is even, else N = K0, K = N0; W_l [N, K] lies at w_ptr + l * N0 * K0."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rn = tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    w_pref = tl.zeros((BLOCK_N, BLOCK_K), dtype=w_ptr.dtype.element_ty)
    if PREFETCH:  # the first tile of GEMV 0 (its K is K0)
        w_pref = _w_tile(w_ptr, pid * BLOCK_N + rn, kk, N0, K0, K0)
    for layer in range(L):
        odd = layer % 2
        N = tl.where(odd == 1, K0, N0)
        K = tl.where(odd == 1, N0, K0)
        w_l = w_ptr + layer * N0 * K0  # < 2^31 elements for L <= 255 at these shapes
        x_row = act_ptr + layer * stride_act
        y_row = act_ptr + (layer + 1) * stride_act
        for t in range(pid, tl.cdiv(N, BLOCK_N), nprog):
            rows = t * BLOCK_N + rn
            acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                k = k0 + kk
                if PREFETCH:  # the program's first tile of this GEMV was loaded before the barrier
                    first = (t == pid) & (k0 == 0)  # (folded into the column bound: the interpreter
                    w = _w_tile(w_l, rows, k, N, K, tl.where(first, 0, K))  # rejects vector & scalar masks)
                    w = tl.where(first, w_pref, w)
                else:
                    w = _w_tile(w_l, rows, k, N, K, K)
                x = tl.load(x_row + k, mask=k < K, other=0.0, cache_modifier=".cg").to(tl.float32)
                acc += w.to(tl.float32) * x[None, :]
            tl.store(y_row + rows, tl.sum(acc, axis=1).to(act_ptr.dtype.element_ty), mask=rows < N)
        if layer + 1 < L:
            if PREFETCH:  # GEMV l + 1: N and K swap
                w_pref = _w_tile(w_ptr + (layer + 1) * N0 * K0, pid * BLOCK_N + rn, kk, K, N, N)
            _grid_barrier(counter_ptr, (layer + 1) * nprog)


def reference(x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    for w in weights:
        x = (w.float() @ x.float()).to(w.dtype)
    return x


def run_launches(act: torch.Tensor, weights: list[torch.Tensor], plans: dict) -> None:
    for layer, w in enumerate(weights):
        n, k = w.shape
        gemv_triton(act[layer, :k][None], w, plans[(n, k)], out=act[layer + 1, :n][None])


def run_persistent(act, w_all, counter, n_layers, n0, k0, grid, block_n, block_k, prefetch) -> None:
    counter.zero_()
    _chain_kernel[(grid,)](
        act,
        w_all,
        counter,
        n_layers,
        n0,
        k0,
        act.stride(0),
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PREFETCH=prefetch,
    )


def resident_programs(block_n: int, block_k: int, dtype: torch.dtype, device: torch.device) -> int:
    """How many ``_chain_kernel`` programs (4 warps) fit one SM at once, from its compiled registers and
    shared memory: a grid-wide barrier deadlocks unless every program is resident."""
    act = torch.zeros(2, 64, dtype=dtype, device=device)
    w = torch.zeros(64 * 64, dtype=dtype, device=device)
    c = torch.zeros(1, dtype=torch.int32, device=device)
    k = _chain_kernel.warmup(
        act, w, c, 1, 64, 64, 64, BLOCK_N=block_n, BLOCK_K=block_k, PREFETCH=True, grid=(1,)
    )
    k._init_handles()
    props = torch.cuda.get_device_properties(device)
    by_regs = 65536 // max(1, k.n_regs * 128)
    by_smem = props.shared_memory_per_multiprocessor // max(1, k.metadata.shared) if k.metadata.shared else 32
    return min(by_regs, by_smem, 16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--programs-per-sm", type=int, default=4)
    ap.add_argument("--block-n", type=int, default=2)
    ap.add_argument("--block-k", type=int, default=1024)
    ap.add_argument("--shape", default="2048x4096", help="N0xK0 of the even GEMVs (tiny: the boundary alone)")
    a = ap.parse_args()
    n0, k0 = (int(v) for v in a.shape.split("x"))
    if INTERPRET:
        dev, dtype, n0, k0, n_layers, a.block_k = torch.device("cpu"), torch.float32, 16, 32, 3, 16
    else:
        dev, dtype, n_layers = torch.device("cuda"), torch.bfloat16, a.layers
    gen = torch.Generator(device=dev).manual_seed(0)
    w_all = torch.empty(n_layers * n0 * k0, dtype=dtype, device=dev)
    weights = []
    for layer in range(n_layers):
        n, k = (n0, k0) if layer % 2 == 0 else (k0, n0)
        w = w_all[layer * n0 * k0 : (layer + 1) * n0 * k0].view(n, k)
        w.copy_((torch.randn(n, k, generator=gen, device=dev) * k**-0.5).to(dtype))
        weights.append(w)
    act = torch.zeros(n_layers + 1, max(n0, k0), dtype=dtype, device=dev)
    act[0, :k0] = torch.randn(k0, generator=gen, device=dev).to(dtype)
    counter = torch.zeros(1, dtype=torch.int32, device=dev)
    block = {"BLOCK_N": a.block_n, "BLOCK_K": a.block_k, "num_warps": 4}
    plans = {(n0, k0): dict(block), (k0, n0): dict(block, BLOCK_N=2 * a.block_n)}
    if INTERPRET:
        grid = 1
    else:
        fit = resident_programs(a.block_n, a.block_k, dtype, dev)
        if a.programs_per_sm > fit:
            raise ValueError(f"--programs-per-sm {a.programs_per_sm}: only {fit} fit an SM (registers, smem)")
        grid = torch.cuda.get_device_properties(dev).multi_processor_count * a.programs_per_sm
    want = reference(act[0, :k0], weights)
    out_len = want.shape[0]
    variants = {
        "launches": lambda: run_launches(act, weights, plans),
        "persistent": lambda: run_persistent(
            act, w_all, counter, n_layers, n0, k0, grid, a.block_n, a.block_k, False
        ),
        "persistent+prefetch": lambda: run_persistent(
            act, w_all, counter, n_layers, n0, k0, grid, a.block_n, a.block_k, True
        ),
    }
    for name, fn in variants.items():
        act[1:] = float("nan")
        fn()
        got = act[n_layers, :out_len]
        err = ((got.double() - want.double()).norm() / want.double().norm()).item()
        print(f"{name:20s} rel err against torch {err:.2e}", flush=True)
        if not err < 2e-2:
            raise SystemExit(f"{name}: the chain's output is wrong (rel err {err:.3g})")
    if INTERPRET:
        return
    nbytes = n0 * k0 * w_all.element_size()
    print(f"{n_layers} GEMVs of {nbytes / 1e6:.1f} MB, grid {grid} for the persistent kernel")
    base = None
    for name, fn in variants.items():
        us = time_ms(fn) * 1e3 / n_layers  # CUDA-graph replay, median
        base = us if base is None else base
        print(
            f"{name:20s} {us:7.2f} us a GEMV  {nbytes / us / 1e3:7.1f} GB/s  {us - base:+6.2f} us against launches"
        )


if __name__ == "__main__":
    main()
