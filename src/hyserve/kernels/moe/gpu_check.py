"""One-shot H200 check of the fused MoE: ``PYTHONPATH=src python3 -m hyserve.kernels.moe.gpu_check``.

1. correctness at the real shapes (E=256, k=8, H=2048, I=512, bf16, realistic router, fresh random
   inputs) vs the reference for every path (auto plan, GEMV decode, decode with the multi-kernel
   grouping, prefill "scatter" at small T), NaN-poisoned outputs and workspaces; tokens whose
   reference top-k is tied at the k-th logit (bf16 logits tie often) are checked on routing only;
2. the scatter down's fused sum (``check_fused_sum``; ``--fused-sum`` runs it alone) and the atomic routing
   (``check_atomic_routing``, ``--atomic-routing`` alone: bit-identical to the scan routing's output); routing ids/weights vs torch; bitwise
   determinism; CUDA-graph replay;
3. the benchmark (``bench.py``) with the per-stage breakdown; the short table last.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F

E, TOP_K, H, I = 256, 8, 2048, 512
_LAYER_WEIGHTS = ("gate_weight", "w_gate_up", "w_down", "shared_gate_up", "shared_down", "shared_expert_gate")


def _moe_runner(layer: dict):
    """``run(x, plan, **kw)``: ``fused_moe_triton`` on the layer's weights."""
    from hyserve.kernels.moe.triton_moe import fused_moe_triton

    w = [layer[n] for n in _LAYER_WEIGHTS]
    return lambda x, plan, **kw: fused_moe_triton(x, *w[:3], TOP_K, *w[3:], plan=plan, **kw)


def _replayed(fn, *args, **kwargs) -> torch.Tensor:
    """``fn(*args, **kwargs)``'s output after capturing it in a CUDA graph and replaying that twice."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(*args, **kwargs)
    g.replay()
    g.replay()
    torch.cuda.synchronize()
    return out


def check_fused_sum(
    layer: dict, failures: list[str], tokens: tuple[int, ...] = (24, 300, 1024, 4096)
) -> None:
    """The scatter down's sum in its tail against its sum kernel: bit-identical outputs, graph replays equal,
    the counters left at zero."""
    from hyserve.kernels import tickets
    from hyserve.kernels.moe import bench
    from hyserve.kernels.moe.configs import fit_plan, get_plan

    run = _moe_runner(layer)
    print(
        "the scatter down's fused sum against its sum kernel (bitwise, graph replay, counters left at zero):"
    )
    for T in tokens:
        x = bench.make_x(T, H, seed=13)
        p = get_plan(max(T, 16), E, H, I, TOP_K, torch.bfloat16)
        p = fit_plan(dict(p, block_m=max(16, p["block_m"]), down_mode="scatter"), H, I)
        outs = []
        for fused in (False, True):
            plan = dict(p, down={**p["down"], "fused_sum": fused})
            outs.append(run(x, plan, force_large_routing=True))
        c = _replayed(run, x, plan, force_large_routing=True)
        zero = int(tickets.ticket_counters("moe down sum", x.device, 1).abs().sum()) == 0
        same, replay = torch.equal(outs[0], outs[1]), torch.equal(outs[0], c)
        print(f"  T={T:5d} equal={same} replay={replay} zeroed={zero} nan={bool(outs[1].isnan().any())}")
        if not (same and replay and zero):
            failures.append(f"fused sum T={T}")


def check_atomic_routing(
    layer: dict, failures: list[str], tokens: tuple[int, ...] = (512, 1024, 4096, 8192)
) -> None:
    """The atomic-rank routing (``atomic_routing``) against the scan routing: the MoE output bit-identical to
    the scan's and run to run (its pairs' order within an expert varies), graph replays equal, counters left at
    zero."""
    from hyserve.kernels import tickets
    from hyserve.kernels.moe import bench
    from hyserve.kernels.moe.configs import get_plan

    run = _moe_runner(layer)
    print(
        "the atomic routing against the scan routing (bitwise, five runs, graph replay, counters left at zero):"
    )
    for T in tokens:
        x = bench.make_x(T, H, seed=17)
        p = get_plan(T, E, H, I, TOP_K, torch.bfloat16)
        scan = run(x, dict(p, atomic_routing=False))
        plan = dict(p, atomic_routing=True)
        runs = [run(x, plan) for _ in range(5)]
        c = _replayed(run, x, plan)
        zero = int(tickets.ticket_counters("moe_route_atomic", x.device, E + 1).abs().sum()) == 0
        same = all(torch.equal(r, scan) for r in runs)
        replay = torch.equal(c, scan)
        print(f"  T={T:5d} equal={same} replay={replay} zeroed={zero} nan={bool(runs[0].isnan().any())}")
        if not (same and replay and zero):
            failures.append(f"atomic routing T={T}")


def main() -> int:
    import triton

    from hyserve.kernels.moe import bench, fused_moe, workspace
    from hyserve.kernels.moe.configs import config_path, fit_plan, get_plan
    from hyserve.kernels.moe.reference import fused_moe_reference, route_reference
    from hyserve.kernels.moe.router import route_and_align_fused
    from hyserve.kernels.moe.routing import route_and_align
    from hyserve.kernels.moe.triton_moe import fused_moe_triton

    t_start = time.time()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    cfg = config_path(E, H, I, torch.bfloat16)
    tuned = cfg.exists() and json.loads(cfg.read_text()).get("tuned", False)
    print(f"configs: {cfg.name} {'tuned' if tuned else 'untuned defaults'}")
    layer = bench.make_layer(E, H, I)
    names = ("gate_weight", "w_gate_up", "w_down")
    shared = ("shared_gate_up", "shared_down", "shared_expert_gate")
    failures = []

    def ties(x: torch.Tensor) -> torch.Tensor:
        """k-th and (k+1)-th logits within one bf16 ulp: any choice is a valid top-k."""
        s = F.linear(x, layer["gate_weight"]).float().sort(-1, descending=True).values
        return (s[:, TOP_K - 1] - s[:, TOP_K]) <= s[:, TOP_K - 1].abs() * 2.0**-7

    def check(T: int, label: str, plan: dict | None, force_large: bool = False) -> None:
        x = bench.make_x(T, H, seed=11)
        workspace.POISON = True
        out = torch.full_like(x, float("nan"))
        fused_moe_triton(
            x,
            *[layer[n] for n in names],
            TOP_K,
            *[layer[n] for n in shared],
            plan=plan,
            force_large_routing=force_large,
            out=out,
        )
        workspace.POISON = False
        ref = fused_moe_reference(x, *[layer[n] for n in names], TOP_K, *[layer[n] for n in shared])
        ok = ~ties(x)
        d = (out[ok].float() - ref[ok].float()).norm() / ref[ok].float().norm()
        m = (out[ok].float() - ref[ok].float()).abs().max() / ref[ok].float().abs().max()
        nan = bool(out.isnan().any())
        good = (not nan) and d.item() < 1e-2 and m.item() < 5e-2
        print(
            f"  {label:28s} T={T:5d} rel_l2={d.item():.2e} rel_max={m.item():.2e} "
            f"tied={int((~ok).sum())} {'ok' if good else 'FAIL'}"
        )
        if not good:
            failures.append(f"{label} T={T}")

    print("correctness vs reference (bf16, real shapes):")
    for T in (1, 2, 5, 16, 32, 64, 128, 200, 1024, 4096):
        check(T, "auto plan", None)
    for T in (1, 2, 4, 8):
        p = fit_plan(dict(get_plan(T, E, H, I, TOP_K, torch.bfloat16), block_m=T, down_mode="reduce"), H, I)
        check(T, f"gemv block_m={T}", p)
    for T in (1, 8, 64):
        p = dict(get_plan(T, E, H, I, TOP_K, torch.bfloat16), fused_router=False)
        check(T, "decode, cuBLAS router", p)
    for T in (4, 33):
        check(T, "decode, multi-kernel routing", None, force_large=True)
    for T in (1, 24):
        p = fit_plan(
            dict(get_plan(512, E, H, I, TOP_K, torch.bfloat16), block_m=16, down_mode="scatter"), H, I
        )
        check(T, "prefill kernels at small T", p, force_large=True)

    check_fused_sum(layer, failures)
    check_atomic_routing(layer, failures)

    print("routing vs torch:")
    for T in (1, 64, 3000):
        x = bench.make_x(T, H, seed=3)
        logits = F.linear(x, layer["gate_weight"])
        for force in ("fused", False, True):
            if force == "fused":
                if T > 64:
                    continue
                rt = route_and_align_fused(x, layer["gate_weight"], TOP_K, 16, True)
            else:
                rt = route_and_align(logits, TOP_K, 16, True, x.dtype, force_large=force)
            w_ref, ids_ref = route_reference(x, layer["gate_weight"], TOP_K)
            ok = ~ties(x)
            same = (rt.topk_ids.long().sort(-1).values == ids_ref.sort(-1).values).all(-1)
            werr = (rt.topk_weights[ok] - w_ref[ok].float()).abs().max().item() if ok.any() else 0.0
            good = bool(same[ok].all()) and werr < 1e-2
            print(
                f"  T={T:5d} multi-kernel={force!s:5s} id mismatches (untied)={int((~same & ok).sum())} w_err={werr:.1e}"
            )
            if not good:
                failures.append(f"routing T={T} force_large={force}")

    print("determinism and CUDA graphs:")
    for T in (4, 300):
        x = bench.make_x(T, H, seed=5)
        args = (x, *[layer[n] for n in names], TOP_K, *[layer[n] for n in shared])
        a, b = fused_moe(*args), fused_moe(*args)
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fused_moe(*args)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            c = fused_moe(*args)
        g.replay()
        torch.cuda.synchronize()
        good = torch.equal(a, b) and torch.equal(a, c)
        print(f"  T={T:4d} bitwise repeatable={torch.equal(a, b)} graph replay equal={torch.equal(a, c)}")
        if not good:
            failures.append(f"determinism T={T}")
    print(f"checks done in {time.time() - t_start:.0f}s")

    print("\nbenchmark (one layer; CUDA graph; L2 flushed):")
    print(bench.HEADER)
    rows = bench.run_bench(bench.DECODE_T + bench.PREFILL_T, ref=True, breakdown=True)
    print(f"\ntotal {time.time() - t_start:.0f}s; failures: {failures or 'none'}")
    print(bench.HEADER)
    for r in rows:
        print(bench.format_row(r))
    per_layer = {r["T"]: r["ms"] for r in rows}
    if 1 in per_layer:
        print(f"x40 layers: T=1 {40 * per_layer[1]:.2f} ms/token", end="")
        if 32 in per_layer:
            print(f", T=32 {40 * per_layer[32]:.2f} ms/step", end="")
        print()
    return 1 if failures else 0


if __name__ == "__main__":
    alone = {"--fused-sum": check_fused_sum, "--atomic-routing": check_atomic_routing}
    if len(sys.argv) == 2 and sys.argv[1] in alone:
        from hyserve.kernels.moe import bench

        fails: list[str] = []
        alone[sys.argv[1]](bench.make_layer(E, H, I), fails)
        sys.exit(1 if fails else 0)
    sys.exit(main())
