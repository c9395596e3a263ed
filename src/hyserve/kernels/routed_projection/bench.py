"""Micro-benchmark of the routed projections at one token, the 35B model's shapes (bf16, E = 256, top-8).

``python -m hyserve.kernels.routed_projection.bench``: time (CUDA-graph replay, median; inputs rotate so the
weights come from HBM), bytes, TB/s and % of 4.0 TB/s of

- the routing out-projection ``[M; W_o]`` [256 + 2048, 4096] (the top-k included; M_SPLIT 1, 2, 4; and over the
  fragment-ordered 12-bit copy, ``mma_kernel.py``, at several SPLIT / KSPLIT, its bytes the copy's) against what
  it replaces: the out_proj GEMV [2048, 4096] with its residual, then the fused router with its pre-norm; and
  against the out_proj GEMV alone (the bytes of W_o without M's 2 MB);
- the experts' gate_up at batch 1 (8 routed pairs + the shared expert, 9 x [1024, 2048]) taking the routing as
  given (NORM_X: the pre-norm and the weights' softmax inside) against the plain kernel on a normed x, with
  the batch-1 plan and with its register cap removed (``maxnreg``: 1152 programs fit one wave at <= 56
  registers a thread).

On the CPU (the interpreter) ``--small`` smoke-tests the file on small shapes; the numbers mean nothing there.
"""

from __future__ import annotations

import argparse

import torch

from hyserve.kernels.linear.triton_kernel import gemv_triton
from hyserve.kernels.moe.configs import get_plan
from hyserve.kernels.moe.router import route_topk_fused
from hyserve.kernels.moe.triton_pairs import gate_up_pairs
from hyserve.kernels.rmsnorm.bench import DEVICE, DTYPE, HBM, Cycle, copies_for, time_ms
from hyserve.kernels.routed_projection import plans
from hyserve.kernels.routed_projection.triton_kernel import project_out_route_triton


def _row(op: str, us: float, nbytes: int, **extra) -> dict:
    return dict(op=op, us=us, TBps=nbytes / us / 1e6, pct_hbm=100 * nbytes / (us * 1e-6) / HBM, **extra)


def bench_out_projection(H: int, Hv: int, E: int, top_k: int) -> list[dict]:
    found = plans(12352, H, H, Hv, E) if H == 2048 else None
    plan = found[1] if found else dict(BLOCK_N=1, BLOCK_K=min(1024, Hv), num_warps=4)  # Hv: a power of 2
    nbytes = (E + H) * Hv * 2
    routed, plain = [], []
    for _ in range(copies_for(nbytes)):
        w = torch.randn(E + H, Hv, device=DEVICE, dtype=DTYPE) * Hv**-0.5
        a = torch.randn(1, Hv, device=DEVICE, dtype=DTYPE)
        h0 = torch.randn(1, H, device=DEVICE, dtype=DTYPE)
        partial = torch.randn(1, E, device=DEVICE, dtype=DTYPE)  # the in-projection's last columns
        gate = torch.randn(E, H, device=DEVICE, dtype=DTYPE) * H**-0.5
        nw = torch.randn(H, device=DEVICE, dtype=DTYPE) * 0.1
        routed.append((a, w, h0, partial, top_k, plan))
        plain.append((a, w[E:], h0, gate, nw, top_k, plan))

    def out_then_router(a, w_o, h0, gate, nw, k, p):
        gemv_triton(a, w_o, p, residual=h0)
        return route_topk_fused(h0, gate, k, norm_weight=nw, norm_eps=1e-6)

    def out_only(a, w_o, h0, gate, nw, k, p):
        return gemv_triton(a, w_o, p, residual=h0)

    rows = []
    for split in (1, 2, 4):  # M's rows in column slices (the top-k tail under W_o's stream)
        if split == 1 or Hv % (split * plan["BLOCK_K"]) == 0:
            cycle = Cycle(project_out_route_triton, [(*r[:5], dict(plan, M_SPLIT=split)) for r in routed])
            rows.append(
                _row(f"routing out-projection [{E}+{H}, {Hv}] M_SPLIT {split}", time_ms(cycle) * 1e3, nbytes)
            )
    if DEVICE == "cuda" and DTYPE == torch.bfloat16 and H == 2048:  # over the fragment-ordered 12-bit copy
        from hyserve.kernels.mma_gemv import pack_mma
        from hyserve.kernels.routed_projection.mma_kernel import project_out_route_mma

        packed = [(r[0], pack_mma(r[1]), *r[2:5]) for r in routed]
        for split, ksplit in ((8, 1), (8, 2), (8, 4), (4, 4), (4, 8), (8, 8)):
            cfg = {"SPLIT": split, "KSPLIT": ksplit}
            if Hv % (128 * split * ksplit) == 0:
                us = time_ms(Cycle(project_out_route_mma, [(*r, cfg) for r in packed])) * 1e3
                rows.append(_row(f"routing out-projection, 12-bit mma SPLIT {split} KSPLIT {ksplit}", us,
                                 packed[0][1].nbytes))  # fmt: skip
    us_plain = time_ms(Cycle(out_then_router, plain)) * 1e3
    us_out = time_ms(Cycle(out_only, plain)) * 1e3
    return rows + [
        _row(f"out_proj [{H}, {Hv}] + router [{E}, {H}]", us_plain, (H * Hv + E * H) * 2),
        _row(f"out_proj [{H}, {Hv}] alone", us_out, H * Hv * 2),
    ]


def bench_gate_up(H: int, inter: int, E: int, top_k: int) -> list[dict]:
    base = dict(get_plan(1, E, H, inter, top_k, DTYPE)["gate_up"])
    uncapped = {k: v for k, v in base.items() if k != "maxnreg"}
    nbytes = (top_k + 1) * 2 * inter * H * 2
    w = torch.randn(E, 2 * inter, H, device=DEVICE, dtype=DTYPE) * H**-0.5
    sw = torch.randn(2 * inter, H, device=DEVICE, dtype=DTYPE) * H**-0.5
    sg = torch.randn(1, H, device=DEVICE, dtype=DTYPE) * H**-0.5
    nw = torch.randn(H, device=DEVICE, dtype=DTYPE) * 0.1
    inputs = []
    for _ in range(max(1, min(64, E // top_k))):  # fresh experts every call: their weights come from HBM
        ids = torch.randperm(E, device=DEVICE)[:top_k].int().view(1, top_k)
        raw = torch.randn(1, top_k, device=DEVICE)
        inputs.append((torch.randn(1, H, device=DEVICE, dtype=DTYPE), ids, raw, torch.softmax(raw, -1)))
    rows = []
    for name, cfg, norm in (
        ("gate_up, normed x", base, False),
        ("gate_up NORM_X", base, True),
        ("gate_up NORM_X, no register cap", uncapped, True),
    ):

        def call(x, ids, raw, weights, cfg=cfg, norm=norm):
            if norm:
                return gate_up_pairs(x, w, sw, sg, ids, raw, cfg, norm_weight=nw, norm_eps=1e-6)
            return gate_up_pairs(x, w, sw, sg, ids, weights, cfg)

        rows.append(
            _row(f"{name} ({top_k}+1 x [{2 * inter}, {H}])", time_ms(Cycle(call, inputs)) * 1e3, nbytes)
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--small", action="store_true", help="small shapes (the CPU interpreter's smoke test)"
    )
    args = parser.parse_args()
    H, Hv, inter, E, k = (64, 128, 32, 16, 4) if args.small else (2048, 4096, 512, 256, 8)
    for r in bench_out_projection(H, Hv, E, k) + bench_gate_up(H, inter, E, k):
        print("  ".join(f"{key}={v:.2f}" if isinstance(v, float) else f"{key}={v}" for key, v in r.items()))


if __name__ == "__main__":
    main()
