"""Sweep the fused-MoE tile plans on the H200 and write ``configs/E256_H2048_I512_bfloat16.json``.

``PYTHONPATH=src python3 -m hyserve.kernels.moe.tune [--tokens 1,2,...] [--jobs 16] [--quick] [--out PATH] [--merge]``

Per token bucket T in {1, 2, 4, ..., 8192}: for each candidate block_m (GEMV block_m = T for T <= 8,
16 for decode, ~tokens-per-expert for prefill) the routing is computed once, then every gate_up config
is timed (and the fused router kernel against cuBLAS + the routing kernel), then every down config (the "reduce" decode kernel for T <= 128, the "scatter" prefill
kernels for block_m >= 16, T >= 16) on the best gate_up's output; the plan with the least
gate_up + down time wins. Timing: each launch captured in a CUDA graph, ``triton.testing.do_bench``
median with the L2 flushed between replays (weights are never L2-resident in a real forward).

Compilation dominates a naive sweep (~2 s per variant, ~300 variants), so every candidate is first
compiled in parallel by spawned worker processes that run the same launch wrappers with
``workspace.WARMUP_ONLY`` (``kernel.warmup``: compile into Triton's disk cache, launch nothing); the
timing pass then only loads the cached binaries. Failing configs (e.g. out of shared memory) are
skipped. GEMM shapes covered: gate_up E=256 x N=1024 x K=2048, down E=256 x N=2048 x K=512, bf16, k=8.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import multiprocessing as mp
import os
import time

import torch
import torch.nn.functional as F

E, TOP_K, H, I = 256, 8, 2048, 512
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def _grid(**axes) -> list[dict]:
    keys = list(axes)
    return [dict(zip(keys, vals)) for vals in itertools.product(*axes.values())]


def _ws(pairs: list[tuple[int, int]]) -> list[dict]:
    return [{"num_warps": w, "num_stages": s} for w, s in pairs]


def _cross(a: list[dict], b: list[dict]) -> list[dict]:
    return [dict(x, **y) for x in a for y in b]


def block_ms(T: int) -> list[int]:
    if T <= 8:
        return [T, 16]  # GEMV with one block per expert, tensor-core dots
    if T <= 64:
        return [16]
    r = T * TOP_K / E  # tokens per expert
    p = 16
    while p < r:
        p *= 2
    return sorted({min(128, p), min(128, 2 * p)}) if r > 8 else [16]


def candidates(T: int, bm: int, quick: bool) -> dict[str, list[dict]]:
    """Configs per kernel kind for this (T, block_m)."""
    out: dict[str, list[dict]] = {}
    if bm < 16:  # GEMV variants: no pipelining stages to speak of
        # a [block_m, BLOCK_I, BLOCK_K] fp32 product lives in registers: keep it <= 32K elements
        gu = _grid(BLOCK_I=[8, 16, 32], BLOCK_K=[64, 128, 256, 512])
        out["gate_up"] = _cross([c for c in gu if bm * c["BLOCK_I"] * c["BLOCK_K"] <= 32768], _ws([(4, 2)]))
        dn = _grid(BLOCK_H=[8, 16, 32], BLOCK_K=[128, 256, 512])
        out["reduce"] = _cross([c for c in dn if bm * c["BLOCK_H"] * c["BLOCK_K"] <= 32768], _ws([(4, 2)]))
    elif T <= 64:
        out["gate_up"] = _cross(
            _grid(BLOCK_I=[16, 32, 64], BLOCK_K=[128, 256]), _ws([(4, 3), (4, 4), (4, 5), (8, 4)])
        )
        tp_first = T <= 16
        out["reduce"] = _cross(
            _grid(BLOCK_H=[16, 32], BLOCK_K=[128, 256, 512] if tp_first else [256, 512]),
            _ws([(4, 4), (4, 6), (4, 8), (8, 6)] if tp_first else [(4, 6), (4, 8)]),
        )
        if T >= 16:
            out["scatter"] = _cross(_grid(BLOCK_H=[64, 128], BLOCK_K=[64, 128]), _ws([(4, 3), (4, 4)]))
    else:
        bis = [32, 64, 128] if bm <= 32 else [64, 128]
        out["gate_up"] = _cross(_grid(BLOCK_I=bis, BLOCK_K=[64, 128]), _ws([(4, 3), (4, 4), (8, 3), (8, 4)]))
        out["scatter"] = _cross(
            _grid(BLOCK_H=[64, 128, 256], BLOCK_K=[64, 128]), _ws([(4, 3), (4, 4), (8, 3)])
        )
        if T <= 128:
            out["reduce"] = _cross(_grid(BLOCK_H=[16, 32], BLOCK_K=[256, 512]), _ws([(4, 6), (4, 8)]))
    for kind in ("gate_up", "scatter"):  # the grouped kernels also with the weights through TMA descriptors
        if bm >= 16 and kind in out:
            out[kind] = out[kind] + [dict(c, TMA=1) for c in out[kind]]
    out = {k: [c for c in v if _fits(k, bm, c)] for k, v in out.items()}
    if quick:
        out = {k: v[:: max(1, len(v) // 6)] for k, v in out.items()}
    return out


PAIRS_MAX_T = 8  # token buckets that also try the per-pair path


def pairs_candidates(quick: bool) -> dict[str, list[dict]]:
    """Configs of the per-pair kernels (GEMV: the fp32 accumulators [BLOCK_I, BLOCK_K] x2 and
    [k, BLOCK_H, BLOCK_I] live in registers, so their products are bounded unless REDUCE_EACH shrinks
    them to [BLOCK_I] and [k, BLOCK_H]; PREFETCH keeps a second weight tile in flight)."""
    opts = [
        {"REDUCE_EACH": 0, "PREFETCH": 0},
        {"REDUCE_EACH": 1, "PREFETCH": 0},
        {"REDUCE_EACH": 1, "PREFETCH": 1},
    ]
    gu = _cross(_grid(BLOCK_I=[4, 8, 16, 32], BLOCK_K=[256, 512, 1024], num_warps=[4, 8]), opts)
    gu = [
        c
        for c in gu
        if c["BLOCK_I"] * c["BLOCK_K"] <= 32 * c["num_warps"] * (64 if not c["REDUCE_EACH"] else 128)
    ]
    dn = _cross(_grid(BLOCK_H=[2, 4, 8, 16], BLOCK_I=[64, 128, 256, 512], num_warps=[4, 8]), opts)
    dn = [
        c
        for c in dn
        if TOP_K * c["BLOCK_H"] * c["BLOCK_I"] <= 32 * c["num_warps"] * (64 if not c["REDUCE_EACH"] else 128)
    ]
    out = {"pairs_gate_up": gu, "pairs_down": dn}
    if quick:
        out = {k: v[:: max(1, len(v) // 6)] for k, v in out.items()}
    return out


def _fits(kind: str, bm: int, c: dict) -> bool:
    """Drop configs that cannot fit the 227 KB of shared memory (pipelined tiles, stages - 1 buffers) or
    that spill for sure (a [128, >=64] x2 accumulator on 4 warps) - checked by compiling for sm_90."""
    if bm < 16:
        return True
    stages = c["num_stages"] - 1
    if kind == "gate_up":
        tile = bm * c["BLOCK_K"] + 2 * c["BLOCK_K"] * c["BLOCK_I"]
        if bm >= 128 and c["num_warps"] < 8:
            return False
    elif kind == "scatter":
        tile = bm * c["BLOCK_K"] + c["BLOCK_K"] * c["BLOCK_H"]
        if bm >= 128 and c["BLOCK_H"] >= 256 and c["num_warps"] < 8:
            return False
    else:
        tile = 0
    return stages * tile * 2 <= 227 * 1024


# --------------------------------------------------------------------------- shared by workers and timing


def make_inputs(init: bool) -> dict:
    if init:
        from hyserve.kernels.moe.bench import make_layer

        return make_layer(E, H, I)
    dt = torch.bfloat16
    return dict(
        gate_weight=torch.empty(E, H, dtype=dt, device="cuda"),
        w_gate_up=torch.empty(E, 2 * I, H, dtype=dt, device="cuda"),
        w_down=torch.empty(E, H, I, dtype=dt, device="cuda"),
        shared_gate_up=torch.empty(2 * I, H, dtype=dt, device="cuda"),
        shared_down=torch.empty(H, I, dtype=dt, device="cuda"),
        shared_expert_gate=torch.empty(1, H, dtype=dt, device="cuda"),
    )


def make_x(T: int, init: bool) -> torch.Tensor:
    if init:
        from hyserve.kernels.moe.bench import make_x as mx

        return mx(T, H)
    return torch.empty(T, H, dtype=torch.bfloat16, device="cuda")


def route(layer: dict, x: torch.Tensor, bm: int, fused: bool = False, large: bool = False):
    from hyserve.kernels.moe.router import route_and_align_fused
    from hyserve.kernels.moe.routing import route_and_align

    if fused:
        return route_and_align_fused(x, layer["gate_weight"], TOP_K, bm, True)
    return route_and_align(F.linear(x, layer["gate_weight"]), TOP_K, bm, True, x.dtype, force_large=large)


def run_gate_up(layer: dict, x: torch.Tensor, rt, bm: int, cfg: dict) -> torch.Tensor:
    from hyserve.kernels.moe.triton_gate_up import gate_up

    return gate_up(
        x,
        layer["w_gate_up"],
        layer["shared_gate_up"],
        layer["shared_expert_gate"],
        rt.topk_weights,
        rt.sorted_pairs,
        rt.meta,
        rt.max_blocks,
        bm,
        cfg,
    )


def run_down(kind: str, layer: dict, h: torch.Tensor, rt, bm: int, T: int, cfg: dict) -> torch.Tensor:
    from hyserve.kernels.moe.triton_decode import down_reduce
    from hyserve.kernels.moe.triton_prefill import down_scatter_sum

    fn = down_reduce if kind == "reduce" else down_scatter_sum
    return fn(
        h, layer["w_down"], layer["shared_down"], rt.sorted_pairs, rt.meta, rt.max_blocks, bm, T, TOP_K, cfg
    )


def topk_pairs(layer: dict, x: torch.Tensor, block_e: int | None = None):
    """(ids, weights) of the pairs path: fused router (block_e experts per program) or cuBLAS + top-k."""
    from hyserve.kernels.moe.router import route_topk_fused
    from hyserve.kernels.moe.routing import route_topk

    if block_e:
        rt = route_topk_fused(x, layer["gate_weight"], TOP_K, block_e)
        return rt.topk_ids, rt.topk_weights
    return route_topk(F.linear(x, layer["gate_weight"]), TOP_K, x.dtype)


def run_pairs(kind: str, layer: dict, x: torch.Tensor, ids, w, h, cfg: dict) -> torch.Tensor:
    from hyserve.kernels.moe.triton_pairs import down_pairs, gate_up_pairs

    if kind == "pairs_gate_up":
        return gate_up_pairs(
            x, layer["w_gate_up"], layer["shared_gate_up"], layer["shared_expert_gate"], ids, w, cfg
        )
    return down_pairs(h, layer["w_down"], layer["shared_down"], ids, cfg)


def _compile_worker(specs: list[tuple[int, int, str, dict]]) -> tuple[int, list[str]]:
    """Spawned process: compile the given (T, block_m, kind, cfg) launches into the disk cache."""
    from hyserve.kernels.moe import workspace

    workspace.WARMUP_ONLY = True
    layer = make_inputs(init=False)
    done, errors = 0, []
    for T, bm, kind, cfg in specs:
        try:
            x = make_x(T, init=False)
            rt = route(layer, x, bm)
            h = torch.empty(T * TOP_K + T, I, dtype=x.dtype, device="cuda")
            if kind == "router":
                route(layer, x, bm, fused=True)
            elif kind == "pairs_router":
                topk_pairs(layer, x, cfg.get("block_e"))
            elif kind.startswith("pairs_"):
                ids = torch.zeros(T, TOP_K, dtype=torch.int32, device="cuda")
                w = torch.empty(T, TOP_K, dtype=torch.float32, device="cuda")
                run_pairs(kind, layer, x, ids, w, h, cfg)
            elif kind == "gate_up":
                run_gate_up(layer, x, rt, bm, cfg)
            else:
                run_down(kind, layer, h, rt, bm, T, cfg)
            done += 1
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is skipped later
            errors.append(f"{T} {bm} {kind} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
    return done, errors


def precompile(tokens: tuple[int, ...], quick: bool, jobs: int) -> None:
    # one group per (block_m, kind, config): all its token counts go to the same worker, so the
    # variants that differ only in T-dependent int specialisations hit that worker's disk cache
    groups: dict[tuple, list] = {}
    for T in tokens:
        for bm in block_ms(T):
            for kind, cfgs in candidates(T, bm, quick).items():
                for cfg in cfgs:
                    groups.setdefault((bm, kind, tuple(sorted(cfg.items()))), []).append((T, bm, kind, cfg))
    from hyserve.kernels.moe.routing import small_routing

    for T in tokens:
        if small_routing(T, E, TOP_K):
            for bm in block_ms(T):
                groups[("router", T, bm)] = [(T, bm, "router", {})]
        if T <= PAIRS_MAX_T:
            for be in (None, 4, 8):
                groups[("pairs_router", T, be)] = [(T, 1, "pairs_router", {"block_e": be})]
            for kind, cfgs in pairs_candidates(quick).items():
                for cfg in cfgs:
                    groups.setdefault((1, kind, tuple(sorted(cfg.items()))), []).append((T, 1, kind, cfg))
    ordered = sorted(groups.values(), key=len, reverse=True)
    specs = [s for g in ordered for s in g]
    t0 = time.time()
    chunks: list[list] = [[] for _ in range(jobs)]
    for i, g in enumerate(ordered):
        chunks[i % jobs].extend(g)
    ctx = mp.get_context("spawn")
    n, errs = 0, []
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as ex:
        for done, e in ex.map(_compile_worker, chunks):
            n += done
            errs += e
    print(f"precompiled {n}/{len(specs)} variants with {jobs} workers in {time.time() - t0:.0f}s", flush=True)
    for e in errs[:10]:
        print("  compile error:", e)


# --------------------------------------------------------------------------- timing


def time_graph(fn) -> float:
    """Median ms of fn replayed from a CUDA graph, L2 flushed before each replay; inf if it fails."""
    import triton.testing

    try:
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return float(triton.testing.do_bench(g.replay, warmup=5, rep=25, return_mode="median"))
    except Exception as exc:  # noqa: BLE001
        print(f"    skipped: {type(exc).__name__}: {str(exc)[:100]}")
        torch.cuda.synchronize()
        return float("inf")


def tune(tokens: tuple[int, ...], quick: bool) -> tuple[dict, dict]:
    from hyserve.kernels.moe.routing import small_routing

    layer = make_inputs(init=True)
    buckets, timings = {}, {}
    for T in tokens:
        x = make_x(T, init=True)
        best = None
        t_route = time_graph(lambda x=x: route(layer, x, 16))
        fused = small_routing(T, E, TOP_K)
        t_fused = time_graph(lambda x=x: route(layer, x, 16, fused=True)) if fused else float("inf")
        # the multi-kernel grouping against the single-program one it replaces up to SMALL_PAIRS
        t_large = time_graph(lambda x=x: route(layer, x, 16, large=True)) if fused else float("inf")
        use_fused = t_fused < min(t_route, t_large)
        use_large = not use_fused and t_large < t_route
        print(
            f"T={T:5d} routing: cuBLAS router + routing {t_route * 1e3:.1f}us, fused {t_fused * 1e3:.1f}us, "
            f"multi-kernel {t_large * 1e3:.1f}us",
            flush=True,
        )
        t_route = min(t_route, t_fused, t_large)
        for bm in block_ms(T):
            rt = route(layer, x, bm)
            cands = candidates(T, bm, quick)
            gu = [
                (time_graph(lambda c=c, x=x, rt=rt, bm=bm: run_gate_up(layer, x, rt, bm, c)), c)
                for c in cands["gate_up"]
            ]
            gu_ms, gu_cfg = min(gu, key=lambda r: r[0])
            _print_tma_split(T, bm, "gate_up", gu)
            h = run_gate_up(layer, x, rt, bm, gu_cfg)
            for kind in ("reduce", "scatter"):
                if kind not in cands:
                    continue
                dn = [
                    (
                        time_graph(
                            lambda c=c, k=kind, h=h, rt=rt, bm=bm, T=T: run_down(k, layer, h, rt, bm, T, c)
                        ),
                        c,
                    )
                    for c in cands[kind]
                ]
                dn_ms, dn_cfg = min(dn, key=lambda r: r[0])
                _print_tma_split(T, bm, kind, dn)
                total = gu_ms + dn_ms
                print(
                    f"T={T:5d} bm={bm:3d} gate_up {gu_ms * 1e3:8.1f}us {gu_cfg}  {kind} {dn_ms * 1e3:8.1f}us {dn_cfg}",
                    flush=True,
                )
                if best is None or total < best[0]:
                    best = (
                        total,
                        {
                            "block_m": bm,
                            "down_mode": kind,
                            "fused_router": use_fused,
                            "large_routing": use_large,
                            "gate_up": gu_cfg,
                            "down": dn_cfg,
                        },
                        {"route_us": t_route * 1e3, "gate_up_us": gu_ms * 1e3, "down_us": dn_ms * 1e3},
                    )
        if T <= PAIRS_MAX_T:
            pairs = tune_pairs(layer, x, quick)
            print(
                f"T={T:5d} pairs: route {pairs[2]['route_us']:.1f}us gate_up {pairs[2]['gate_up_us']:.1f}us "
                f"down {pairs[2]['down_us']:.1f}us {pairs[1]}",
                flush=True,
            )
            if best is None or pairs[0] < best[0] + t_route:
                best = (pairs[0] - t_route, pairs[1], pairs[2])
        if best is None:
            from hyserve.kernels.moe.configs import default_plan

            print(f"T={T}: every candidate failed; keeping the default plan")
            best = (float("inf"), default_plan(T, E, H, I, TOP_K), {})
        buckets[T] = best[1]
        timings[T] = {k: round(v, 2) for k, v in best[2].items()}
        print(f"T={T:5d} best {best[1]}  total {(best[0] + t_route) * 1e3:.1f}us", flush=True)
    return buckets, timings


def _print_tma_split(T: int, bm: int, kind: str, timed: list[tuple[float, dict]]) -> None:
    """The best time with pointer loads and with TMA weights, where both were timed."""
    best = {}
    for ms, c in timed:
        key = "tma" if c.get("TMA") else "pointer"
        if ms < best.get(key, (float("inf"),))[0]:
            best[key] = (ms, c)
    if len(best) == 2:
        line = "  ".join(f"{k} {v[0] * 1e3:.1f}us {v[1]}" for k, v in sorted(best.items()))
        print(f"T={T:5d} bm={bm:3d} {kind}: {line}", flush=True)


def tune_pairs(layer: dict, x: torch.Tensor, quick: bool) -> tuple[float, dict, dict]:
    """(total ms including routing, plan, per-stage us) of the best per-pair plan for x."""
    from hyserve.kernels.moe.routing import small_routing

    fused = small_routing(x.shape[0], E, TOP_K)
    routes = [
        (time_graph(lambda be=be: topk_pairs(layer, x, be)), be)
        for be in ((None, 4, 8) if fused else (None,))
    ]
    t_route, be = min(routes, key=lambda r: r[0])
    ids, w = topk_pairs(layer, x)
    cands = pairs_candidates(quick)
    gu = [
        (time_graph(lambda c=c: run_pairs("pairs_gate_up", layer, x, ids, w, None, c)), c)
        for c in cands["pairs_gate_up"]
    ]
    gu_ms, gu_cfg = min(gu, key=lambda r: r[0])
    h = run_pairs("pairs_gate_up", layer, x, ids, w, None, gu_cfg)
    dn = [
        (time_graph(lambda c=c: run_pairs("pairs_down", layer, x, ids, w, h, c)), c)
        for c in cands["pairs_down"]
    ]
    dn_ms, dn_cfg = min(dn, key=lambda r: r[0])
    plan = {
        "block_m": 1,
        "down_mode": "pairs",
        "fused_router": be is not None,
        "gate_up": gu_cfg,
        "down": dn_cfg,
    }
    if be is not None:
        plan["router_be"] = be
    stages = {"route_us": t_route * 1e3, "gate_up_us": gu_ms * 1e3, "down_us": dn_ms * 1e3}
    return t_route + gu_ms + dn_ms, plan, stages


def merge_buckets(old: dict[str, dict], new: dict[str, dict]) -> dict[str, dict]:
    """``--merge``: the old file's buckets with the newly tuned ones over them. A re-tuned bucket keeps the old plan's
    keys this tuner does not choose (``atomic_routing``, ``mma_grouped``, ... from A/B runs: not tied to the tiles);
    the gate_up and down configs are the new ones whole, so an option the step tuner set on the old tiles (``L2PF``,
    ``maxnreg``) is dropped, with a line saying so (``scripts/tune_step.py`` sets it again on the new tiles)."""
    merged = dict(old)
    for key, plan in new.items():
        before = old.get(key, {})
        merged[key] = {**before, **plan}
        for kernel in ("gate_up", "down"):
            dropped = sorted(set(before.get(kernel, {})) - set(plan.get(kernel, {})))
            if dropped:
                print(f"bucket {key}: {kernel} options of the old tiles dropped: {', '.join(dropped)}")
    return merged


def main() -> None:
    import triton

    from hyserve.kernels.moe.configs import config_path

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--quick", action="store_true", help="about 1/6 of the configs")
    ap.add_argument("--out", default=None, help="default: configs/E256_H2048_I512_bfloat16.json")
    ap.add_argument("--merge", action="store_true", help="keep the other buckets of a tuned --out file")
    a = ap.parse_args()
    tokens = tuple(int(t) for t in a.tokens.split(","))
    t0 = time.time()
    if a.jobs > 1:
        try:
            precompile(tokens, a.quick, a.jobs)
        except Exception as exc:  # noqa: BLE001 - the timing pass compiles what is missing itself
            print(f"parallel precompile failed ({type(exc).__name__}: {exc}); compiling serially")
    buckets, timings = tune(tokens, a.quick)
    data = {
        "note": "fused MoE tile plans (see configs.py); written by tune.py",
        "tuned": True,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "E": E,
        "H": H,
        "I": I,
        "top_k": TOP_K,
        "dtype": "bfloat16",
        "buckets": {str(k): v for k, v in buckets.items()},
        "timings_us": {str(k): v for k, v in timings.items()},
    }
    out = a.out or str(config_path(E, H, I, torch.bfloat16))
    if a.merge and os.path.exists(out):
        with open(out) as f:
            old = json.load(f)
        if old.get("tuned"):
            data["buckets"] = merge_buckets(old.get("buckets", {}), data["buckets"])
            data["timings_us"] = {**old.get("timings_us", {}), **data["timings_us"]}
            data["buckets"] = dict(sorted(data["buckets"].items(), key=lambda kv: int(kv[0])))
            data["timings_us"] = dict(sorted(data["timings_us"].items(), key=lambda kv: int(kv[0])))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(json.dumps(data))
    print(f"wrote {out} in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
