"""Micro-benchmark of ``gemv_mma`` against the Triton bf16 GEMV plan at the routed in-projections' shapes.

``python -m hyserve.kernels.mma_gemv.bench [--write]``: per weight shape (with the pre-norm, and the router's
256 raw rows where the shape has them), the Triton plan on the bf16 weight and the mma kernel at every SPLIT,
each a CUDA graph of 40 launches with PDL over weight copies that overflow the L2; time a launch, the bytes it
streams over that time, and the time against the Triton plan's (the format moves 0.75 of the bytes). Outputs
are checked against the reference first. ``--write`` keeps the fastest SPLIT per shape in
``configs/mma_gemv.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from hyserve.kernels.gated_delta_rule.bench import HBM, fmt
from hyserve.kernels.linear import gemv_plan
from hyserve.kernels.linear.triton_kernel import gemv_triton
from hyserve.kernels.mma_gemv import CONFIG_PATH, gemv_mma, gemv_mma_reference, pack_mma
from hyserve.kernels.mma_gemv.cuda_kernel import SPLITS
from hyserve.kernels.testing import rel_err

# (N, K, first raw row): in_proj and qkv with the router's rows, and without
SHAPES = ((12608, 2048, 12352), (9472, 2048, 9216), (12352, 2048, None), (9216, 2048, None))
LAUNCHES = 40


def graph_us(calls: list) -> float:
    """Median us a call, over replays of one CUDA graph holding ``calls`` back to back."""
    for c in calls[:2]:
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    times = []
    for _ in range(8):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times[1:])


def bench_shape(n: int, k: int, raw_from: int | None) -> list[dict]:
    torch.manual_seed(n)
    copies = max(2, min(LAUNCHES, (768 << 20) // (n * k * 2)))
    ws = [(torch.randn(n, k, device="cuda") * k**-0.5).bfloat16() for _ in range(copies)]
    packs = [pack_mma(w) for w in ws]
    x = torch.randn(1, k, device="cuda").bfloat16()
    g = (torch.randn(k, device="cuda") * 0.1).bfloat16()
    ref = gemv_mma_reference(x, packs[0], g, 1e-6, raw_from)
    order = [i % copies for i in range(LAUNCHES)]
    plan = gemv_plan(n, k) or gemv_plan(n - 256, k)
    rows = []
    name = f"{n}x{k}" + (f" raw {raw_from}" if raw_from else "")

    def triton_call(i: int):
        return lambda: gemv_triton(x, ws[i], plan, norm_weight=g, norm_eps=1e-6, raw_from=raw_from)

    def mma_call(i: int, split: int):
        return lambda: gemv_mma(
            x, packs[i], {"SPLIT": split}, norm_weight=g, norm_eps=1e-6, raw_from=raw_from
        )

    base = None
    if plan is not None:
        err = rel_err(triton_call(0)().float(), ref.float())
        base = graph_us([triton_call(i) for i in order])
        rows.append(
            dict(shape=name, kernel="triton bf16 plan", us=base, TBps=n * k * 2 / base / 1e6, rel_err=err)
        )
    for split in SPLITS:
        if k % (128 * split):
            continue
        err = rel_err(mma_call(0, split)().float(), ref.float())
        us = graph_us([mma_call(i, split) for i in order])
        nbytes = packs[0].nbytes
        rows.append(dict(shape=name, kernel=f"mma SPLIT {split}", us=us, TBps=nbytes / us / 1e6, rel_err=err))
    for r in rows:
        r["pct_hbm"] = 100 * r["TBps"] * 1e12 / HBM
        r["vs_plan"] = r["us"] / base if base else float("nan")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="store the fastest SPLIT per shape in the config")
    args = ap.parse_args()
    rows = []
    for n, k, raw in SHAPES:
        rows += bench_shape(n, k, raw)
        torch.cuda.empty_cache()
    print(fmt(rows))
    if args.write:
        table = json.loads(CONFIG_PATH.read_text()) if CONFIG_PATH.exists() else {"plans": {}}
        for n, k, _ in SHAPES:
            mine = [r for r in rows if r["shape"].startswith(f"{n}x{k}") and r["kernel"].startswith("mma")]
            best = min(mine, key=lambda r: r["us"])
            table["plans"][f"{n}x{k}"] = {"SPLIT": int(best["kernel"].split()[-1])}
        table["device"] = torch.cuda.get_device_name()
        CONFIG_PATH.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {CONFIG_PATH}")


if __name__ == "__main__":
    main()
