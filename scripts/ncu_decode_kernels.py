"""The batch-1 decode kernels at the model's shapes, for Nsight Compute: what limits each one.

The decode step at B=1 is ~310 kernels of 2-15 us that sit at 60-85% of HBM bandwidth or are latency-bound
(docs/performance.md). Timings alone do not say whether a kernel waits on memory latency, runs short of
resident warps, or spills; the hardware counters do. This script launches each kernel twice (a compiling
launch, then the one to read) on fresh inputs, eagerly and without PDL, so each can be profiled alone:

    ncu --clock-control none -k regex:'gemv|router|pairs|gdn|paged|qk_norm' --csv --page raw \\
        --metrics "$(python3 scripts/ncu_decode_kernels.py --metrics)" \\
        python3 scripts/ncu_decode_kernels.py > ncu.csv
    python3 scripts/ncu_decode_kernels.py --summarize ncu.csv

``--summarize`` prints,
per kernel and grid size (the second launch of each), its duration, DRAM throughput (% of peak), achieved and
theoretical occupancy, registers a thread, grid size, the share of cycles a scheduler issued, and warps stalled
per issued instruction by reason (long_scoreboard: waiting on global memory; barrier, membar: CTA barriers and
fences; not_selected: ready while another warp issued, a sign of an instruction-bound kernel).
``scripts/device/ncu.sh`` runs both on the H200.
"""

from __future__ import annotations

import argparse
import csv
import os

HIDDEN, EXPERTS, INTER, TOP_K = 2048, 256, 512, 8
# the GEMVs of a step at batch 1: in_proj and attention qkv with the pre-norm, out_proj with the residual
GEMVS = ((12352, 2048, "norm"), (9216, 2048, "norm"), (2048, 4096, "res"))


def _random_bf16():
    """rnd(*shape, scale=1.0): seeded Gaussian bf16 tensors on the GPU."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    return lambda *shape, scale=1.0: (torch.randn(*shape, device="cuda", generator=gen) * scale).to(
        torch.bfloat16
    )


def launch_all() -> None:
    import torch

    os.environ["HYSERVE_PDL"] = "0"  # each kernel alone: no overlap with its neighbours to attribute
    from hyserve.kernels import gdn_decode_step
    from hyserve.kernels.attention.triton_decode import paged_decode
    from hyserve.kernels.gdn_decode_step.bench import step_inputs
    from hyserve.kernels.linear import gemv_plan
    from hyserve.kernels.linear.triton_kernel import gemv_triton
    from hyserve.kernels.moe.bench import make_layer, make_x
    from hyserve.kernels.moe.configs import get_plan
    from hyserve.kernels.moe.router import route_topk_fused
    from hyserve.kernels.moe.triton_pairs import down_pairs, gate_up_pairs
    from hyserve.kernels.qk_norm_rope import qk_norm_rope_store

    dev, bf = "cuda", torch.bfloat16
    rnd = _random_bf16()
    g = rnd(HIDDEN, scale=0.1)
    for n, k, kind in GEMVS:
        w = rnd(n, k, scale=k**-0.5)
        xin = rnd(1, k)
        for _ in range(2):
            if kind == "norm":
                gemv_triton(xin, w, gemv_plan(n, k), norm_weight=rnd(k, scale=0.1), norm_eps=1e-6)
            else:
                gemv_triton(xin, w, gemv_plan(n, k), residual=rnd(1, n))
    layer = make_layer()
    plan = get_plan(1, EXPERTS, HIDDEN, INTER, TOP_K, bf)
    xr = make_x(1)
    for _ in range(2):
        rt = route_topk_fused(xr, layer["gate_weight"], TOP_K, plan.get("router_be"), g, 1e-6)
        h = gate_up_pairs(
            rt.normed_x,
            layer["w_gate_up"],
            layer["shared_gate_up"],
            layer["shared_expert_gate"],
            rt.topk_ids,
            rt.topk_weights,
            plan["gate_up"],
        )
        down_pairs(
            h, layer["w_down"], layer["shared_down"], rt.topk_ids, plan["down"], out=xr.clone(), add_out=True
        )
    for args in step_inputs(1, 2):
        gdn_decode_step(*args)
    # attention at a ~640-token context: q/k norm + rope with the KV store (one kernel), the split + reduce decode
    hq, hk, d, page, ctx, rot = 16, 2, 256, 16, 640, 64
    blocks = ctx // page + 1
    k_cache = rnd(blocks + 4, page, hk, d)
    v_cache = rnd(blocks + 4, page, hk, d)
    tables = torch.arange(blocks, dtype=torch.int32, device=dev)[None, :]
    seq_lens = torch.tensor([ctx], dtype=torch.int32, device=dev)
    cu = torch.tensor([0, 1], dtype=torch.int32, device=dev)
    slots = torch.tensor([ctx - 1], dtype=torch.int64, device=dev)
    positions = torch.tensor([ctx - 1], dtype=torch.int64, device=dev)
    cos = torch.rand(ctx, rot // 2, device=dev)
    sin = torch.rand(ctx, rot // 2, device=dev)
    for _ in range(2):
        q = qk_norm_rope_store(
            rnd(1, hq, d), rnd(1, hk, d), rnd(1, hk, d), rnd(d, scale=0.1), rnd(d, scale=0.1), 1e-6, cos, sin,
            positions, rot, k_cache, v_cache, slots,
        )  # fmt: skip
        paged_decode(q, k_cache, v_cache, cu, seq_lens, tables, d**-0.5, gate=rnd(1, hq, d), max_seq_len=ctx)
    torch.cuda.synchronize()


STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
STALL_KINDS = (
    "long_scoreboard", "barrier", "membar", "wait", "lg_throttle", "short_scoreboard", "math_pipe_throttle",
    "not_selected", "no_instruction",
)  # fmt: skip
METRICS = (
    ("gpu__time_duration.sum", "ns"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram%"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "occ%"),
    ("sm__maximum_warps_per_active_cycle_pct", "theo%"),
    ("launch__registers_per_thread", "regs"),
    ("launch__grid_size", "grid"),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue%"),
) + tuple((STALL.format(k), k) for k in STALL_KINDS)


def summarize(path: str) -> None:
    """One line per kernel (its last profiled launch) from ``ncu --csv --page raw --metrics ...``: the
    metrics above, the stall columns as warps stalled per issued instruction."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu prints its own log lines before the CSV
    rows = list(csv.DictReader(lines))[1:]  # the first row under the header holds the units
    last: dict[str, dict[str, str]] = {}
    for r in sorted(rows, key=lambda r: int(r["ID"])):
        last[f"{r['Kernel Name'].split('(')[0]}/{r.get('launch__grid_size', '')}"] = r
    print(f"{'kernel':30s} " + " ".join(f"{label[:9]:>9s}" for _, label in METRICS))
    for name, r in last.items():
        vals = [r.get(metric, "-").replace(",", "") for metric, _ in METRICS]
        print(f"{name[:30]:30s} " + " ".join(f"{v[:9]:>9s}" for v in vals))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--summarize", default=None, help="an ncu --csv --page raw file to condense")
    ap.add_argument("--metrics", action="store_true", help="print the metric list for ncu --metrics")
    a = ap.parse_args()
    if a.metrics:
        print(",".join(m for m, _ in METRICS))
    elif a.summarize:
        summarize(a.summarize)
    else:
        launch_all()


if __name__ == "__main__":
    main()
