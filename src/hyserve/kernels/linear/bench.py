"""Micro-benchmark and tile sweep of the GEMV at the model's projection shapes (bf16, batch 1).

``python -m hyserve.kernels.linear.bench [--rows 1] [--write]``: per weight shape (N, K), cuBLAS
(``F.linear``) and every GEMV tile config, CUDA-graph replay with weights rotated over copies that
overflow the L2; GB/s and % of 4.0 TB/s. ``--write`` stores the winner per shape in
``configs/gemv.json`` (``"cublas"`` where cuBLAS won), which ``linear()`` reads.

``--max-rows [--write]``: per shape, the committed plan against cuBLAS at 1..4 rows; the plan's ``max_rows``
becomes the last row count before the first at which cuBLAS wins by more than ``NORM_US`` (the cuBLAS path
runs the pre-norm as a launch of its own, which the GEMV fuses).
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F

from hyserve.kernels.gated_delta_rule.bench import COLD_BYTES, DEVICE, DTYPE, HBM, Cycle, fmt, time_ms
from hyserve.kernels.linear import CONFIG_PATH, GEMV_MAX_ROWS
from hyserve.kernels.linear.triton_kernel import gemv_triton

# Qwen3.6-35B-A3B: DeltaNet in_proj (qkv|z|b|a), DeltaNet out_proj and attention o_proj, attention qkv,
# the LM head
SHAPES = ((12352, 2048), (2048, 4096), (9216, 2048), (248320, 2048))


def configs(block_k: tuple[int, ...] = (256, 512, 1024), tma: tuple[int, ...] = ()) -> list[dict]:
    """Tiles whose fp32 accumulator [BLOCK_N, BLOCK_K] stays within 64 registers a thread, and with
    REDUCE_EACH (a [BLOCK_N] accumulator: only the W tile is held) twice as large tiles; with ``tma``
    stage counts, also the TMA-pipelined tiles (BLOCK_K 128 or 256, the TMA box limit)."""
    out = []
    for n, k, w, red in itertools.product((1, 2, 4, 8, 16), block_k, (4, 8), (0, 1)):
        if n * k >= 512 and n * k <= 64 * 32 * w * (2 if red else 1):
            out.append({"BLOCK_N": n, "BLOCK_K": k, "num_warps": w, **({"REDUCE_EACH": 1} if red else {})})
    for n, k, w, st in itertools.product((2, 4, 8, 16), (128, 256), (4,), tma):
        if n * k >= 512 and n * k <= 64 * 32 * w:
            out.append({"BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "TMA": st})
    return out


def bench_shape(n: int, k: int, rows: int, cands: list[dict]) -> tuple[list[dict], dict | str]:
    gen = torch.Generator(device=DEVICE).manual_seed(n + k)
    w_bytes = n * k * 2
    copies = max(1, min(32, COLD_BYTES // w_bytes)) if DEVICE == "cuda" else 1
    sets = [
        (
            torch.randn(rows, k, device=DEVICE, generator=gen).to(DTYPE),
            (torch.randn(n, k, device=DEVICE, generator=gen) * k**-0.5).to(DTYPE),
        )
        for _ in range(copies)
    ]
    x, w = sets[0]
    ref = F.linear(x, w).float()
    rows_out = []
    best: tuple[float, dict | str] = (time_ms(Cycle(F.linear, sets)), "cublas")
    rows_out.append(
        dict(shape=f"{n}x{k}", cfg="cublas", us=best[0] * 1e3, pct_hbm=100 * w_bytes / (best[0] * 1e-3) / HBM)
    )
    for cfg in cands:
        try:
            got = gemv_triton(x, w, cfg).float()
        except Exception as e:  # noqa: BLE001 - a tile the compiler or the TMA encoder rejects: report, go on
            print(f"{n}x{k} {cfg}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        err = ((got - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            raise AssertionError(f"{n}x{k} {cfg}: rel err {err}")
        ms = time_ms(Cycle(gemv_triton, sets, cfg=cfg))
        rows_out.append(
            dict(shape=f"{n}x{k}", cfg=str(cfg), us=ms * 1e3, pct_hbm=100 * w_bytes / (ms * 1e-3) / HBM)
        )
        if ms < best[0]:
            best = (ms, cfg)
    return rows_out, best[1]


NORM_US = 2.0  # what the separate norm launch of the cuBLAS path costs at these shapes (a GEMV plan fuses it)


def bench_max_rows(n: int, k: int, plan: dict) -> tuple[list[dict], int]:
    """(the GEMV with ``plan`` against cuBLAS at 1..GEMV_MAX_ROWS rows, the plan's max_rows)."""
    table, max_rows = [], GEMV_MAX_ROWS
    for rows in range(1, GEMV_MAX_ROWS + 1):
        out, _ = bench_shape(n, k, rows, [plan])
        cublas, gemv = (next(r["us"] for r in out if (r["cfg"] == "cublas") == c) for c in (True, False))
        table.append(dict(shape=f"{n}x{k}", rows=rows, gemv_us=gemv, cublas_us=cublas))
        if max_rows == GEMV_MAX_ROWS and gemv > cublas + NORM_US:
            max_rows = rows - 1
    return table, max_rows


def main_max_rows(write: bool, shapes) -> None:
    from hyserve.kernels.linear import gemv_plan

    doc = json.loads(CONFIG_PATH.read_text())
    table = []
    for n, k in shapes:
        plan = gemv_plan(n, k)
        if plan is None:
            continue
        rows, max_rows = bench_max_rows(n, k, {key: v for key, v in plan.items() if key != "max_rows"})
        table += rows
        doc["plans"][f"{n}x{k}"] = {**plan, "max_rows": max_rows} if max_rows < GEMV_MAX_ROWS else plan
        print(f"{n}x{k}: max_rows {max_rows}", flush=True)
    print(fmt(table))
    if write:
        CONFIG_PATH.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {CONFIG_PATH}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a few configs only (CPU smoke test)")
    parser.add_argument("--shapes", default=None, help="NxK,... (default: the model's four)")
    parser.add_argument("--block-k", default="256,512,1024", help="the BLOCK_K values to sweep")
    parser.add_argument("--merge", action="store_true", help="--write keeps the plans of shapes not swept")
    parser.add_argument("--tma", default="", help="TMA stage counts to add to the sweep, e.g. 3,4,6")
    parser.add_argument(
        "--max-rows", action="store_true", help="the committed plans against cuBLAS at 1..4 rows"
    )
    args = parser.parse_args()
    tma = tuple(int(t) for t in args.tma.split(",") if t)
    cands = configs(tuple(int(k) for k in args.block_k.split(",")), tma)
    shapes = SHAPES
    if args.shapes:
        shapes = tuple(tuple(int(d) for d in s.split("x")) for s in args.shapes.split(","))
    if args.max_rows:
        return main_max_rows(args.write, shapes)
    if DEVICE != "cuda" or args.quick:
        cands, shapes = [{"BLOCK_N": 4, "BLOCK_K": 64, "num_warps": 4}], ((96, 80),)
    plans, table = {}, []
    for n, k in shapes:
        rows, best = bench_shape(n, k, args.rows, cands)
        table += sorted(rows, key=lambda r: r["us"])[:4]
        plans[f"{n}x{k}"] = best
        print(f"best {n}x{k}: {best}", flush=True)
    print(fmt(table))
    if args.write:
        if args.merge and CONFIG_PATH.exists():
            plans = {**json.loads(CONFIG_PATH.read_text())["plans"], **plans}
        doc = {"note": "GEMV tiles per weight shape [N, K] at batch 1; written by linear/bench.py --write",
               "device": torch.cuda.get_device_name(), "plans": plans}  # fmt: skip
        CONFIG_PATH.parent.mkdir(parents=True, exist_ok=True)
        CONFIG_PATH.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {CONFIG_PATH}")


if __name__ == "__main__":
    main()
