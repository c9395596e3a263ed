"""One-shot H200 check of the GDN kernels: correctness at the model's shapes (bf16), then benchmarks.

``PYTHONPATH=src python3 -m hyserve.kernels.gated_delta_rule.gpu_check [--quick]`` (< 3 minutes):

1. correctness vs the references: chunked prefill (varlen incl. 1/63/64/65-token sequences, initial
   states, fp32 too), recurrent decode, the fused decode step under every tile config of the sweep
   (ticketed conv-state write and norm handoff), 12 steps fed back into the same state pools, a CUDA-graph
   capture of the fused step, the varlen conv prefill (sequences shorter than W-1); fla's prefill error
   beside ours when fla is importable;
2. benchmarks: decode and fused step (CUDA graphs), prefill and conv (eager), tile sweeps;
3. a summary table last.
"""

from __future__ import annotations

import argparse
import time
import traceback

import torch

from hyserve.kernels.causal_conv1d.bench import bench as bench_conv
from hyserve.kernels.causal_conv1d.reference import causal_conv1d_prefill_reference
from hyserve.kernels.causal_conv1d.triton_kernel import causal_conv1d_prefill_triton
from hyserve.kernels.gated_delta_rule import bench as gb
from hyserve.kernels.gated_delta_rule.reference import (
    gated_delta_rule_decode_reference,
    gated_delta_rule_prefill_reference,
)
from hyserve.kernels.gated_delta_rule.triton_decode import gated_delta_rule_decode_triton
from hyserve.kernels.gated_delta_rule.triton_prefill import gated_delta_rule_prefill_triton
from hyserve.kernels.gdn_decode_step import bench as sb
from hyserve.kernels.gdn_decode_step.reference import gdn_decode_step_reference
from hyserve.kernels.gdn_decode_step.triton_kernel import _workspace, gdn_decode_step_triton

DEV = gb.DEVICE  # "cuda" (the CPU only dry-runs single checks in the interpreter)
BF16_TOL = 3e-2  # relative (norm) error of bf16 outputs vs the fp32-math reference
START = time.time()
RESULTS: list[tuple[str, bool, str]] = []


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(name: str, fn) -> None:
    try:
        ok, info = fn()
    except Exception as e:  # noqa: BLE001 - report every failure, keep going
        traceback.print_exc()
        ok, info = False, f"{type(e).__name__}: {str(e)[:200]}"
    RESULTS.append((name, ok, info))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {info}", flush=True)


def elapsed() -> float:
    return time.time() - START


# ---------------------------------------------------------------- correctness


def _prefill_case(lens, dtype, h=16, hv=32, kd=128, vd=128, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    t, n = sum(lens), len(lens)
    mixed = torch.randn(t, 2 * h * kd + hv * vd, device=DEV, generator=gen).to(dtype)
    q = mixed[:, : h * kd].view(t, h, kd)
    k = mixed[:, h * kd : 2 * h * kd].view(t, h, kd)
    v = mixed[:, 2 * h * kd :].view(t, hv, vd)
    a = torch.randn(t, hv, device=DEV, generator=gen)
    a_log = torch.rand(hv, device=DEV, generator=gen).mul(15).add(1).log()
    g = -a_log.exp() * torch.nn.functional.softplus(a - 4.0)
    beta = torch.rand(t, hv, device=DEV, generator=gen).to(dtype)
    state = torch.randn(n + 2, hv, kd, vd, device=DEV, generator=gen) * 0.3
    idx = torch.randperm(n + 2, device=DEV, generator=gen)[:n]
    init = torch.tensor([i % 3 != 1 for i in range(n)], device=DEV)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=DEV, dtype=torch.int32)
    return q, k, v, g, beta, state, cu, idx, init


def check_prefill(lens, dtype, tol, configs=None):
    q, k, v, g, beta, state, cu, idx, init = _prefill_case(lens, dtype)
    s_ref, s_tri = state.clone(), state.clone()
    want = gated_delta_rule_prefill_reference(q, k, v, g, beta, s_ref, cu, idx, init)
    got = gated_delta_rule_prefill_triton(q, k, v, g, beta, s_tri, cu, idx, init, configs=configs)
    e_o, e_s = rel(got, want), rel(s_tri[idx], s_ref[idx])
    untouched = torch.ones(state.shape[0], dtype=torch.bool, device=DEV)
    untouched[idx] = False
    same = torch.equal(s_tri[untouched], state[untouched])
    info = f"o err {e_o:.2e}, state err {e_s:.2e}"
    fla = gb.fla_chunk(q, k, v, g, beta, torch.where(init[:, None, None, None], state[idx], 0.0), cu)
    if fla is not None:
        o_fla, _ = fla()
        info += f" | fla o err {rel(o_fla.squeeze(0), want):.2e}"
    return e_o < tol and e_s < tol and same and not got.isnan().any(), info


def check_decode(batch, block_v):
    sets = gb.decode_inputs(batch, 1)
    q, k, v, g, beta, state, idx = sets[0]
    s_ref, s_tri = state.clone(), state.clone()
    want = gated_delta_rule_decode_reference(q, k, v, g, beta, s_ref, idx)
    got = gated_delta_rule_decode_triton(q, k, v, g, beta, s_tri, idx, block_v=block_v)
    e_o, e_s = rel(got, want), rel(s_tri, s_ref)
    return e_o < BF16_TOL and e_s < 1e-5, f"o err {e_o:.2e}, state err {e_s:.2e}"


def check_step(batch, block_v, warps):
    args = list(sb.step_inputs(batch, 1)[0])
    cs, ss = args[9], args[10]
    cs_r, ss_r, cs_t, ss_t = cs.clone(), ss.clone(), cs.clone(), ss.clone()
    want = gdn_decode_step_reference(*args[:9], cs_r, ss_r, args[11])
    got = gdn_decode_step_triton(*args[:9], cs_t, ss_t, args[11], block_v=block_v, num_warps=warps)
    e_o, e_s = rel(got, want), rel(ss_t, ss_r)
    conv_ok = torch.equal(cs_t, cs_r)
    counters = not _workspace(got.device, 0).any()
    ok = e_o < BF16_TOL and e_s < 1e-3 and conv_ok and counters
    return ok, f"o err {e_o:.2e}, state err {e_s:.2e}, conv exact {conv_ok}, counters zero {counters}"


def check_step_many(block_v, batch=8, steps=12):
    args = list(sb.step_inputs(batch, 1)[0])
    cs_r, ss_r, cs_t, ss_t = args[9].clone(), args[10].clone(), args[9].clone(), args[10].clone()
    worst = 0.0
    for step in range(steps):
        fresh = sb.step_inputs(batch, 1, seed=step + 1)[0]
        args[:4] = fresh[:4]
        want = gdn_decode_step_reference(*args[:9], cs_r, ss_r, args[11])
        got = gdn_decode_step_triton(*args[:9], cs_t, ss_t, args[11], block_v=block_v)
        worst = max(worst, rel(got, want))
    e_s = rel(ss_t, ss_r)
    conv_ok = torch.equal(cs_t, cs_r)
    return (
        worst < BF16_TOL and e_s < 1e-2 and conv_ok,
        f"worst o err {worst:.2e}, state err {e_s:.2e}, conv {conv_ok}",
    )


def check_step_graph(batch=4):
    args = list(sb.step_inputs(batch, 1)[0])
    cs, ss = args[9], args[10]
    cs0, ss0 = cs.clone(), ss.clone()
    gdn_decode_step_triton(*args)  # warm-up (compile, workspace)
    cs.copy_(cs0)
    ss.copy_(ss0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gdn_decode_step_triton(*args)
    cs.copy_(cs0)
    ss.copy_(ss0)
    graph.replay()
    torch.cuda.synchronize()
    want = gdn_decode_step_reference(*args[:9], cs0.clone(), ss0.clone(), args[11])
    e = rel(out, want)
    return e < BF16_TOL, f"replayed o err {e:.2e}"


def check_conv(lens):
    from hyserve.kernels.causal_conv1d.bench import inputs

    x, weight, state, cu, idx, init = inputs(lens)
    init = torch.tensor([i % 3 != 1 for i in range(len(lens))], device=DEV)
    s_ref, s_tri = state.clone(), state.clone()
    want = causal_conv1d_prefill_reference(x, weight, s_ref, cu, idx, init)
    got = causal_conv1d_prefill_triton(x, weight, s_tri, cu, idx, init)
    e = rel(got, want)
    exact = torch.equal(s_tri, s_ref)
    return e < 1e-2 and exact, f"out err {e:.2e}, states exact {exact}"


def correctness(quick: bool) -> None:
    lens = [1, 63, 64, 65, 100, 1000, 2048]
    check("prefill bf16 varlen " + str(lens), lambda: check_prefill(lens, torch.bfloat16, BF16_TOL))
    check("prefill bf16 8x512", lambda: check_prefill([512] * 8, torch.bfloat16, BF16_TOL))
    check("prefill fp32 [200, 70, 1]", lambda: check_prefill([200, 70, 1], torch.float32, 1e-4))
    unfused = {"fused_output": False}
    check(
        "prefill fp32 unfused [200, 70, 1]", lambda: check_prefill([200, 70, 1], torch.float32, 1e-4, unfused)
    )
    for i, cfg in enumerate([] if quick else gb.PREFILL_SWEEP):
        check(
            f"prefill bf16 sweep cfg {i} {cfg}",
            lambda cfg=cfg: check_prefill(lens, torch.bfloat16, BF16_TOL, cfg),
        )
    for b in (1, 33):
        for bv in (None, 32, 128):
            check(f"decode B={b} BV={bv}", lambda b=b, bv=bv: check_decode(b, bv))
    configs = [(None, None)] + ([] if quick else [(bv, w) for bv in (32, 64, 128) for w in (4, 8)])
    for b in (1, 4, 32, 65):
        for bv, w in configs:
            check(f"gdn_decode_step B={b} BV={bv} warps={w}", lambda b=b, bv=bv, w=w: check_step(b, bv, w))
    for bv in (32, 64, 128):
        check(f"gdn_decode_step 12 steps BV={bv}", lambda bv=bv: check_step_many(bv))
    check("gdn_decode_step CUDA graph", check_step_graph)
    check("conv prefill [1,2,3,0,700,5,4096]", lambda: check_conv([1, 2, 3, 0, 700, 5, 4096]))


# ---------------------------------------------------------------- benchmarks


def benchmarks(quick: bool, budget_s: float) -> list[dict]:
    rows: list[dict] = []

    def add(fn, *a, **kw):
        if elapsed() > budget_s:
            print(f"  (skipped {getattr(fn, '__name__', fn)}{a}: time budget)")
            return None
        try:
            row = fn(*a, **kw)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row = {"op": getattr(fn, "__name__", "?"), "error": f"{type(e).__name__}: {str(e)[:120]}"}
        rows.append(row)
        print(
            "  " + "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
            flush=True,
        )
        return row

    for b in (1, 8, 32, 64):
        add(sb.bench, b)
    for b in (1, 8, 32, 64):
        add(gb.bench_decode, b)
    for lens in ([128], [1024], [4096], [512] * 8):
        add(gb.bench_prefill, lens)
    for lens in ([1024], [4096], [16384]):
        add(bench_conv, lens, baselines=False)
    if not quick:
        print("sweeps:")
        for b in (1, 4, 16, 32, 64, 128):
            best = None
            for bv in (32, 64, 128):
                for w in (4, 8):
                    r = add(sb.bench, b, bv, w, baselines=False)
                    if r and "us" in r and (best is None or r["us"] < best["us"]):
                        best = r
            if best:
                print(
                    f"best gdn_decode_step B={b}: BV={best['BV']} warps={best['warps']} {best['us']:.1f} us"
                )
        for lens in ([1024], [4096]):
            best = None
            for cfg in gb.PREFILL_SWEEP:
                r = add(gb.bench_prefill, lens, cfg, baselines=False)
                if r and "graph_us" in r and (best is None or r["graph_us"] < best["graph_us"]):
                    best = r
            if best:
                print(f"best prefill {lens} (graph-replayed): {best['cfg']} {best['graph_us']:.1f} us")
        for bt, bd, w in ((16, 256, 4), (64, 128, 8)):
            add(bench_conv, [16384], bt, bd, w, baselines=False)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="default configs only, no sweeps")
    parser.add_argument(
        "--budget", type=float, default=165.0, help="seconds after which benchmarks are skipped"
    )
    opts = parser.parse_args()
    assert torch.cuda.is_available(), "gpu_check needs a GPU"
    import triton

    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    print(f"fla: {'yes' if gb._fla('chunk_gated_delta_rule') else 'no'}")
    torch.backends.cuda.matmul.allow_tf32 = False  # the references in full fp32
    torch.backends.cudnn.allow_tf32 = False
    correctness(opts.quick)
    print(f"correctness done in {elapsed():.0f} s; benchmarks:")
    rows = benchmarks(opts.quick, opts.budget)
    print(f"\n==== summary ({elapsed():.0f} s) ====")
    failed = [r for r in RESULTS if not r[1]]
    print(f"correctness: {len(RESULTS) - len(failed)}/{len(RESULTS)} passed")
    for name, _, info in failed:
        print(f"  FAIL {name}: {info}")
    main_rows = [
        r for r in rows if r.get("BV", "cfg") == "cfg" and r.get("cfg", "cfg") in ("cfg", "cfg/cfg/cfg")
    ]
    print(gb.fmt(main_rows))


if __name__ == "__main__":
    main()
