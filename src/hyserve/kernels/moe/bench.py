"""Micro-benchmark of the fused MoE at the real shapes (E=256, k=8, H=2048, I=512, bf16, one layer).

``python -m hyserve.kernels.moe.bench [--tokens 1,2,4] [--no-ref] [--breakdown]``

Per T: the Triton op captured in a CUDA graph (how the engine runs decode; ``triton.testing.do_bench``
median, L2 flushed before every replay), the bytes that must move (distinct routed experts actually
touched x expert bytes + the shared expert + the router + x and out), GB/s and % of 4.0 TB/s, TFLOP/s
and % of 728 (2 * T * ((k+1) * 3HI + EH) flops), and the eager torch reference for comparison.
``--pairs`` times the few-token kernels (``triton_pairs``) alone at T=1 for tile and plan-option variants:
a graph of one launch per layer over ``PAIRS_LAYERS`` layers of weights (so nothing is L2-resident and launch
overheads overlap as in the decode step), microseconds per launch and % of the bytes' floor, outputs checked
against the first variant. ``--breakdown`` adds the per-stage times (router GEMV, routing/grouping, gate_up, down) of the eager
pipeline. ``--routing`` times only the routing variants per T (graph-replayed, microseconds): one program,
split top-k (tokens per program 1/2/4/8; pairs per ranking program GROUP_CHUNK, or 32/128/1024), the
three-kernel large path. Inputs: realistic router (N(0, 1/H) weights on RMS-normalised x), fresh random weights.
"""

from __future__ import annotations

import argparse
import functools

import torch
import torch.nn.functional as F

HBM_BPS = 4.0e12
PEAK_FLOPS = 728e12
DECODE_T = (1, 2, 4, 8, 16, 32, 64)
PREFILL_T = (512, 1024, 4096)


def make_layer(
    E: int = 256, H: int = 2048, I: int = 512, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape, scale):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    return dict(
        gate_weight=rnd(E, H, scale=H**-0.5),
        w_gate_up=rnd(E, 2 * I, H, scale=H**-0.5),
        w_down=rnd(E, H, I, scale=I**-0.5),
        shared_gate_up=rnd(2 * I, H, scale=H**-0.5),
        shared_down=rnd(H, I, scale=I**-0.5),
        shared_expert_gate=rnd(1, H, scale=H**-0.5),
    )


def make_x(T: int, H: int = 2048, dtype: torch.dtype = torch.bfloat16, seed: int = 1) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed + T)
    x = torch.randn(T, H, generator=g, device="cuda")
    return (x / x.pow(2).mean(-1, keepdim=True).sqrt()).to(dtype)


def moved_bytes(x: torch.Tensor, layer: dict, top_k: int) -> tuple[int, int]:
    """(bytes that must move, distinct routed experts touched) for this batch's actual routing."""
    E, two_i, H = layer["w_gate_up"].shape
    elt = x.element_size()
    ids = torch.topk(
        torch.softmax(F.linear(x, layer["gate_weight"]), -1, dtype=torch.float32), top_k, -1
    ).indices
    touched = int(ids.unique().numel())
    expert = 3 * H * (two_i // 2) * elt
    return touched * expert + expert + E * H * elt + 2 * x.numel() * elt, touched


def flops(T: int, E: int, H: int, I: int, top_k: int) -> float:
    return 2.0 * T * ((top_k + 1) * 3 * H * I + E * H)


def time_ms(fn, graph: bool, rep: int = 100) -> float:
    import triton.testing

    if graph:
        fn()  # compile outside the capture
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    else:
        run = fn
    return float(triton.testing.do_bench(run, warmup=25, rep=rep, return_mode="median"))


def stage_times(x: torch.Tensor, layer: dict, top_k: int) -> dict[str, float]:
    """Eager per-stage times (ms) of the Triton pipeline with the plan fused_moe would pick."""
    from hyserve.kernels.moe.configs import get_plan
    from hyserve.kernels.moe.routing import route_and_align
    from hyserve.kernels.moe.triton_decode import MAX_REDUCE_TOKENS, down_reduce
    from hyserve.kernels.moe.triton_gate_up import gate_up
    from hyserve.kernels.moe.triton_prefill import down_scatter_sum

    T, H = x.shape
    E, two_i, _ = layer["w_gate_up"].shape
    plan = get_plan(T, E, H, two_i // 2, top_k, x.dtype)
    bm = plan["block_m"]
    logits = F.linear(x, layer["gate_weight"])
    rt = route_and_align(logits, top_k, bm, True, x.dtype)
    h = gate_up(
        x,
        layer["w_gate_up"],
        layer["shared_gate_up"],
        layer["shared_expert_gate"],
        rt.topk_weights,
        rt.sorted_pairs,
        rt.meta,
        rt.max_blocks,
        bm,
        plan["gate_up"],
    )
    down = down_reduce if plan["down_mode"] == "reduce" and T <= MAX_REDUCE_TOKENS else down_scatter_sum
    args = (h, layer["w_down"], layer["shared_down"], rt.sorted_pairs, rt.meta, rt.max_blocks, bm, T, top_k)
    fused_sum = {}
    if down is down_scatter_sum:  # the down kernel with the sum in its tail, against down + sum kernel
        cfg = {**plan["down"], "fused_sum": not plan["down"].get("fused_sum", False)}
        fused_sum["down_other_sum"] = time_ms(lambda: down(*args, cfg), False)
    return {
        **fused_sum,
        "router": time_ms(lambda: F.linear(x, layer["gate_weight"]), False),
        "route": time_ms(lambda: route_and_align(logits, top_k, bm, True, x.dtype), False),
        "gate_up": time_ms(
            lambda: gate_up(
                x,
                layer["w_gate_up"],
                layer["shared_gate_up"],
                layer["shared_expert_gate"],
                rt.topk_weights,
                rt.sorted_pairs,
                rt.meta,
                rt.max_blocks,
                bm,
                plan["gate_up"],
            ),
            False,
        ),
        "down": time_ms(lambda: down(*args, plan["down"]), False),
    }


PAIRS_LAYERS = 8
# the T=1 plan, then the TMA option (stage counts; BLOCK_K at most 256) on it and on bigger slices, which TMA's
# copies to shared memory make affordable in registers. Measured on the H200 (2026-12-03): num_stages 1-4
# alike; BLOCK_I 8 or BLOCK_K 512 19-21 us vs 13.7; REDUCE_EACH / PREFETCH within -1% / +7% of the plan alone
# (12.84-16.92 us against 12.97) and slower in the engine.
PAIRS_GATE_UP = [
    {"BLOCK_I": bi, "BLOCK_K": bk, "num_warps": nw, **({"TMA": t} if t else {})}
    for bi, bk, nw, t in (
        (4, 256, 4, 0),
        (4, 256, 4, 3),
        (4, 256, 4, 4),
        (4, 256, 4, 6),
        (8, 256, 4, 4),
        (8, 128, 4, 6),
        (16, 128, 4, 4),
    )
]
PAIRS_DOWN = [
    {"BLOCK_H": bh, "BLOCK_I": bi, "num_warps": nw, "REDUCE_EACH": r, "PREFETCH": p}
    for bh, bi, nw, r, p in (
        (2, 128, 4, 0, 0),
        (2, 128, 4, 1, 0),
        (2, 128, 4, 0, 1),
        (2, 128, 4, 1, 1),
        (4, 128, 4, 1, 1),
        (2, 256, 4, 1, 0),
        (1, 256, 4, 1, 1),
    )
]


def pairs_times(top_k: int = 8) -> list[tuple[str, dict, float, float, float]]:
    """(kernel, cfg, us per launch, % of its bytes' floor at 4.0 TB/s, max |diff| vs the first cfg) at T=1."""
    from hyserve.kernels.moe.routing import route_topk
    from hyserve.kernels.moe.triton_pairs import down_pairs, gate_up_pairs

    layers = [make_layer(seed=i) for i in range(PAIRS_LAYERS)]
    E, two_i, H = layers[0]["w_gate_up"].shape
    x = make_x(1, H)
    routes = [route_topk(F.linear(x, lay["gate_weight"]), top_k, x.dtype) for lay in layers]
    expert_bytes = H * two_i * x.element_size()  # one expert's gate_up (the down has half)

    def gate_up(lay, route, cfg):
        return gate_up_pairs(
            x, lay["w_gate_up"], lay["shared_gate_up"], lay["shared_expert_gate"], *route, cfg
        )

    hs = [gate_up(lay, r, PAIRS_GATE_UP[0]) for lay, r in zip(layers, routes)]
    out = []
    for kind, cfgs in (("gate_up", PAIRS_GATE_UP), ("down", PAIRS_DOWN)):
        nbytes = (top_k + 1) * expert_bytes // (1 if kind == "gate_up" else 2)
        first = None
        for cfg in cfgs:
            if kind == "gate_up":
                fn = lambda cfg=cfg: [gate_up(lay, r, cfg) for lay, r in zip(layers, routes)]  # noqa: E731
            else:
                fn = lambda cfg=cfg: [  # noqa: E731
                    down_pairs(h, lay["w_down"], lay["shared_down"], r[0], cfg)
                    for lay, r, h in zip(layers, routes, hs)
                ]
            try:
                res = fn()[0].clone()
            except Exception as e:  # noqa: BLE001 - a tile the compiler or the TMA encoder rejects
                print(f"{kind:8s} {cfg} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            first = res if first is None else first
            diff = (res.float() - first.float()).abs().max().item()
            us = time_ms(fn, graph=True) * 1e3 / PAIRS_LAYERS
            out.append((kind, cfg, us, 100 * nbytes / (us * 1e-6) / HBM_BPS, diff))
            print(f"{kind:8s} {cfg} {us:7.2f} us {out[-1][3]:5.1f}% diff {diff:.2e}", flush=True)
    return out


MMA_PAIRS_TILES = ((2, 1), (2, 2), (4, 1), (4, 2), (8, 1))  # gate_up_pairs_mma's (SPLIT, DEPTH) variants


def mma_pairs_times(top_k: int = 8) -> list[dict]:
    """The one-token MoE as in the decode step: gate_up (a given routing, the pre-norm inside) then down, PAIRS_LAYERS
    layers of weights in one graph (so that each kernel's pre-wait loads overlap the one before, as there): the
    Triton kernels of the batch-1 plan against ``mma_pairs``' over the 12-bit copies (gate_up at MMA_PAIRS_TILES, down
    at each KSPLIT). us a layer for each pair of kernels, and rel err of h and of the output against the Triton
    pair's."""
    from hyserve.kernels.moe.configs import get_plan
    from hyserve.kernels.moe.mma_experts import pack_mma_experts
    from hyserve.kernels.moe.mma_pairs import KSPLIT, KSPLITS, down_pairs_mma, gate_up_pairs_mma
    from hyserve.kernels.moe.triton_pairs import down_pairs, gate_up_pairs
    from hyserve.kernels.testing import rel_err

    layers = [make_layer(seed=i) for i in range(PAIRS_LAYERS)]
    E, two_i, H = layers[0]["w_gate_up"].shape
    plan = get_plan(1, E, H, two_i // 2, top_k, torch.bfloat16)
    packs = [
        pack_mma_experts(la["w_gate_up"], la["shared_gate_up"], la["w_down"], la["shared_down"])
        for la in layers
    ]
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(1, H, generator=g, device="cuda").bfloat16() * 3
    nw = (torch.randn(H, generator=g, device="cuda") * 0.1).bfloat16()
    routes = []
    for la in layers:  # the routed projection's output: top-k ids and raw logits (before the norm's rstd)
        raw, ids = (x.float() @ (la["gate_weight"].float() * (1 + nw.float())).T).topk(top_k, -1)
        routes.append((ids.int().contiguous(), raw.contiguous()))
    hs = [torch.empty(top_k + 1, two_i // 2, device="cuda", dtype=x.dtype) for _ in layers]
    out = torch.empty(1, H, device="cuda", dtype=x.dtype)
    items = list(zip(layers, routes, hs, packs))

    def gu_triton(la, r, h, pk):
        args = (x, la["w_gate_up"], la["shared_gate_up"], la["shared_expert_gate"], *r, plan["gate_up"])
        gate_up_pairs(*args, h=h, norm_weight=nw, norm_eps=1e-6)

    def gu_mma(tiles):
        return lambda la, r, h, pk: gate_up_pairs_mma(x, pk, *r, nw, 1e-6, la["shared_expert_gate"], tiles, h)

    def dn_triton(la, r, h, pk):
        down_pairs(h, la["w_down"], la["shared_down"], r[0], plan["down"], out)

    def dn_mma(ks):
        return lambda la, r, h, pk: down_pairs_mma(h, pk, r[0], out, ksplit=ks)

    combos = [("triton", gu_triton, "triton", dn_triton)]
    combos += [("triton", gu_triton, f"mma ksplit {ks}", dn_mma(ks)) for ks in KSPLITS]
    for tiles in MMA_PAIRS_TILES:
        combos += [(f"mma {tiles[0]}w d{tiles[1]}", gu_mma(tiles), n, d) for n, d in
                   (("triton", dn_triton), (f"mma ksplit {KSPLIT}", dn_mma(KSPLIT)))]  # fmt: skip
    rows, ref_h, ref_out = [], None, None
    nbytes = (top_k + 1) * 3 * H * (two_i // 2) * 2  # bf16 gate_up + down of 9 experts
    for gname, gu, dname, dn in combos:

        def fn(gu=gu, dn=dn):
            for it in items:
                gu(*it)
                dn(*it)
            return out

        try:
            res = fn().clone()
        except ValueError as exc:
            print(f"gate_up {gname:12s} down {dname:14s} skipped: {exc}", flush=True)
            continue
        h0 = hs[0].clone()
        ref_h, ref_out = (h0, res) if ref_h is None else (ref_h, ref_out)
        us = time_ms(fn, graph=True) * 1e3 / PAIRS_LAYERS
        frac = (2 * (0.75 if gname.startswith("mma") else 1) + (0.75 if dname.startswith("mma") else 1)) / 3
        pct = 100 * nbytes * frac / (us * 1e-6) / HBM_BPS
        errs = rel_err(h0.float(), ref_h.float()), rel_err(res.float(), ref_out.float())
        rows.append(dict(gate_up=gname, down=dname, us=us, pct_floor=pct, rel_err_h=errs[0], rel_err=errs[1]))
        print(
            f"gate_up {gname:12s} down {dname:14s} {us:7.2f} us a layer ({pct:5.1f}% of its bytes' floor) "
            f"rel err h {errs[0]:.2e} out {errs[1]:.2e}",
            flush=True,
        )
    return rows


MMA_GROUPED_TILES = (
    (4, 1, 0),
    (4, 1, 1),
    (4, 1, 2),
    (8, 1, 1),
    (8, 1, 2),
)  # (WARPS, RT, DEPTH) variants of the grouped kernels (DEPTH 0: mma.sync, else wgmma, weight chunks ahead)


def grouped_mma_times(tokens: tuple[int, ...], top_k: int = 8) -> list[dict]:
    """The grouped gate_up (prefill and batched decode) with the plan's routing: the Triton kernel on the bf16
    experts against ``mma_grouped.gate_up_grouped_mma`` over their fragment-ordered 12-bit copy (4 and 8 warps a
    CTA); us a launch (graph-replayed), % of 4.0 TB/s for the touched experts' bf16 and 12-bit bytes, rel err of
    the mma kernel against the Triton kernel's h. Where the plan routes at a BLOCK_M above 64, the same again at
    64 (the 1024-token bucket's Triton tiles)."""
    from hyserve.kernels.moe.configs import get_plan
    from hyserve.kernels.moe.mma_experts import pack_mma_experts

    lay = make_layer()
    E, two_i, H = lay["w_gate_up"].shape
    packed = pack_mma_experts(lay["w_gate_up"], lay["shared_gate_up"], lay["w_down"], lay["shared_down"])
    rows = []
    for T in tokens:
        x = make_x(T, H)
        plan = get_plan(T, E, H, two_i // 2, top_k, x.dtype)
        rows += _grouped_rows(lay, packed, x, top_k, plan)
        if plan["block_m"] > 64:  # routed at 64 instead (lost: performance.md, 2026-12-06)
            rows += _grouped_rows(lay, packed, x, top_k, get_plan(1024, E, H, two_i // 2, top_k, x.dtype))
    return rows


def _grouped_rows(lay: dict, packed, x: torch.Tensor, top_k: int, plan: dict) -> list[dict]:
    """grouped_mma_times' rows of one token count at the routing block size and Triton tiles of ``plan``."""
    from hyserve.kernels.moe.mma_grouped import gate_up_grouped_mma
    from hyserve.kernels.moe.routing import route_and_align
    from hyserve.kernels.moe.triton_gate_up import gate_up
    from hyserve.kernels.moe.triton_prefill import down_scatter_sum

    (T, H), two_i, sg = x.shape, lay["w_gate_up"].shape[1], lay["shared_expert_gate"]
    bm = plan["block_m"]
    rt = route_and_align(F.linear(x, lay["gate_weight"]), top_k, bm, True, x.dtype)
    routed = (rt.topk_weights, rt.sorted_pairs, rt.meta, rt.max_blocks, bm)
    nbytes = (int(rt.topk_ids.unique().numel()) + 1) * two_i * H * 2  # the touched experts' bf16 gate_up
    triton_args = (x, lay["w_gate_up"], lay["shared_gate_up"], sg, *routed, plan["gate_up"])
    ref = gate_up(*triton_args)
    variants = [("triton plan", functools.partial(gate_up, *triton_args), 1.0)]
    for tiles in MMA_GROUPED_TILES:
        fn = functools.partial(gate_up_grouped_mma, x, packed, sg, *routed, tiles=tiles)
        variants.append((_tiles_name(tiles), fn, 0.75))
    rows = _time_variants(f"T={T:5d} bm {bm:3d} gate_up", variants, ref, nbytes)
    y = torch.empty((ref.shape[0], H), device=x.device, dtype=x.dtype)
    down_args = (ref, lay["w_down"], lay["shared_down"], *routed[1:], T, top_k, plan["down"])
    dref = down_scatter_sum(*down_args)
    variants = [("triton plan", functools.partial(down_scatter_sum, *down_args), 1.0)]
    for tiles in MMA_GROUPED_TILES:
        fn = functools.partial(_mma_down_sum, ref, packed, routed, y, T, top_k, tiles)
        variants.append((_tiles_name(tiles), fn, 0.75))
    return rows + _time_variants(f"T={T:5d} bm {bm:3d} down+sum", variants, dref, nbytes // 2)


def _time_variants(label: str, variants: list, ref: torch.Tensor, nbytes: int) -> list[dict]:
    """Time each (name, fn, fraction of nbytes it reads) against ref; a variant whose launch is refused is
    skipped."""
    from hyserve.kernels.testing import rel_err

    rows = []
    for name, fn, frac in variants:
        try:
            err = rel_err(fn().float(), ref.float())
        except (ValueError, RuntimeError) as exc:
            # a shape the kernel does not take, or more registers than an SM has (16 warps at BLOCK_M 128)
            if isinstance(exc, RuntimeError) and "too many resources" not in str(exc):
                raise
            print(f"{label} {name:14s} skipped: {exc}", flush=True)
            continue
        us = time_ms(fn, graph=True) * 1e3
        pct = 100 * nbytes * frac / (us * 1e-6) / HBM_BPS
        rows.append(dict(label=label, kernel=name, us=us, pct_floor=pct, rel_err=err))
        print(
            f"{label} {name:14s} {us:8.1f} us {pct:5.1f}% of its bytes' floor rel err {err:.2e}", flush=True
        )
    return rows


def _tiles_name(tiles: tuple[int, int, int]) -> str:
    return f"wgmma {tiles[0]}w d{tiles[2]}" if tiles[2] else f"mma {tiles[0]}w x {tiles[1]}t"


def _mma_down_sum(h, packed, routed, y, T: int, top_k: int, tiles: tuple[int, int, int]) -> torch.Tensor:
    from hyserve.kernels.moe.mma_grouped import down_grouped_mma
    from hyserve.kernels.moe.triton_prefill import sum_rows

    down_grouped_mma(h, packed, *routed, tiles=tiles, out=y)
    return sum_rows(y, torch.empty((T, y.shape[1]), device=y.device, dtype=y.dtype), T, top_k, True, False)


ROUTING_T = (8, 16, 24, 32, 48, 64)


def _blocks(rt) -> list[list[int]]:
    """The block list of a Routing (entries past the block count are unwritten)."""
    meta, mb = rt.meta.tolist(), rt.max_blocks
    n = meta[3 * mb]
    return [meta[i * mb : i * mb + n] for i in range(3)]


def routing_times(T: int, top_k: int = 8, block_m: int = 16) -> dict[str, float]:
    """Graph-replayed microseconds of each routing variant on the same logits (outputs checked equal)."""
    from hyserve.kernels.moe import routing

    layer = make_layer()
    logits = F.linear(make_x(T), layer["gate_weight"])
    ref = routing.route_and_align(logits, top_k, block_m, True, logits.dtype, split=False)
    variants = {"single": dict(split=False), "large": dict(force_large=True)}
    for bt in (1, 2, 4, 8):
        variants[f"split{bt}"] = dict(split=True, bt=bt)
    for chunk in (32, 128, 1024):  # pairs per ranking program (1024: one program ranks all)
        variants[f"split4/c{chunk}"] = dict(split=True, bt=4, chunk=chunk)
    for bt in (2, 4, 8, 16):  # tokens per top-k program of the large path at any T ("large": the table's)
        variants[f"large{bt}"] = dict(force_large=True, large_bt=((1 << 30, bt),))
        variants[f"atomic{bt}"] = dict(force_large=True, atomic=True, atomic_bt=bt)
    out = {}
    for name, kw in variants.items():
        saved = routing.SPLIT_BLOCK_T, routing.GROUP_CHUNK, routing.LARGE_BLOCK_T, routing.ATOMIC_BLOCK_T
        routing.SPLIT_BLOCK_T = kw.pop("bt", saved[0])
        routing.GROUP_CHUNK = kw.pop("chunk", saved[1])
        routing.LARGE_BLOCK_T = kw.pop("large_bt", saved[2])
        routing.ATOMIC_BLOCK_T = kw.pop("atomic_bt", saved[3])
        try:
            fn = lambda kw=kw: routing.route_and_align(logits, top_k, block_m, True, logits.dtype, **kw)  # noqa: E731
            rt = fn()
            pairs = rt.sorted_pairs.long()
            if kw.get("atomic"):  # each expert's pairs in their atomics' order: compare them sorted
                pairs = pairs[torch.argsort(rt.topk_ids.flatten()[pairs].long() * pairs.numel() + pairs)]
            same = torch.equal(pairs, ref.sorted_pairs.long()) and _blocks(rt) == _blocks(ref)
            out[name] = time_ms(fn, graph=True) * 1e3 if same else float("nan")
        finally:
            routing.SPLIT_BLOCK_T, routing.GROUP_CHUNK, routing.LARGE_BLOCK_T, routing.ATOMIC_BLOCK_T = saved
    return out


def run_bench(
    tokens: tuple[int, ...] = DECODE_T + PREFILL_T, ref: bool = True, breakdown: bool = False, top_k: int = 8
) -> list[dict]:
    from hyserve.kernels.moe import fused_moe
    from hyserve.kernels.moe.reference import fused_moe_reference

    layer = make_layer()
    E, two_i, H = layer["w_gate_up"].shape
    inter = two_i // 2
    rows = []
    for T in tokens:
        x = make_x(T, H)
        args = (
            x,
            layer["gate_weight"],
            layer["w_gate_up"],
            layer["w_down"],
            top_k,
            layer["shared_gate_up"],
            layer["shared_down"],
            layer["shared_expert_gate"],
        )
        ms = time_ms(lambda args=args: fused_moe(*args), graph=True)
        nbytes, touched = moved_bytes(x, layer, top_k)
        row = dict(T=T, experts=touched, ms=ms, MB=nbytes / 1e6)
        row["GBps"] = nbytes / (ms * 1e-3) / 1e9
        row["pct_bw"] = 100 * nbytes / (ms * 1e-3) / HBM_BPS
        row["floor_ms"] = max(nbytes / HBM_BPS, flops(T, E, H, inter, top_k) / PEAK_FLOPS) * 1e3
        row["TFLOPs"] = flops(T, E, H, inter, top_k) / (ms * 1e-3) / 1e12
        row["pct_flops"] = 100 * row["TFLOPs"] * 1e12 / PEAK_FLOPS
        if ref:
            row["ref_ms"] = time_ms(lambda args=args: fused_moe_reference(*args), graph=False, rep=50)
        if breakdown:
            row.update({f"{k}_ms": v for k, v in stage_times(x, layer, top_k).items()})
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


HEADER = (
    f"{'T':>5} {'exp':>4} {'triton ms':>10} {'floor ms':>9} {'MB moved':>9} {'GB/s':>7} {'%4TB/s':>7} "
    f"{'TFLOP/s':>8} {'%728':>6} {'ref ms':>8} {'speedup':>8}"
)


def format_row(r: dict) -> str:
    ref = r.get("ref_ms")
    s = (
        f"{r['T']:>5} {r['experts']:>4} {r['ms']:>10.4f} {r['floor_ms']:>9.4f} {r['MB']:>9.1f} {r['GBps']:>7.0f} "
        f"{r['pct_bw']:>6.1f}% {r['TFLOPs']:>8.1f} {r['pct_flops']:>5.1f}% "
        + (f"{ref:>8.3f} {ref / r['ms']:>7.1f}x" if ref is not None else f"{'-':>8} {'-':>8}")
    )
    if "gate_up_ms" in r:
        s += "   [router {router_ms:.4f} route {route_ms:.4f} gate_up {gate_up_ms:.4f} down {down_ms:.4f}".format(
            **r
        )
        if "down_other_sum_ms" in r:  # the scatter down with the other sum (fused <-> sum kernel)
            s += " down, other sum {down_other_sum_ms:.4f}".format(**r)
        s += "]"
    return s


def print_table(rows: list[dict]) -> None:
    print(HEADER)
    for r in rows:
        print(format_row(r))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default=",".join(map(str, DECODE_T + PREFILL_T)))
    ap.add_argument("--no-ref", action="store_true")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--routing", action="store_true", help="time the routing variants only (us, nan: wrong)")
    ap.add_argument("--pairs", action="store_true", help="time the T=1 pairs kernels' tile/stage variants")
    ap.add_argument(
        "--mma-grouped", action="store_true", help="time the grouped gate_up on tensor cores at --tokens"
    )
    ap.add_argument(
        "--mma-pairs", action="store_true", help="time the one-token gate_up and down over the 12-bit copies"
    )
    a = ap.parse_args()
    assert torch.cuda.is_available(), "the benchmark needs the GPU"
    if a.mma_pairs:
        mma_pairs_times()
        return
    if a.mma_grouped:
        grouped_mma_times(tuple(int(t) for t in a.tokens.split(",")))
        return
    if a.pairs:
        pairs_times()
        return
    if a.routing:
        for T in (
            ROUTING_T
            if a.tokens == ",".join(map(str, DECODE_T + PREFILL_T))
            else map(int, a.tokens.split(","))
        ):
            print(f"T={T:3d} " + "  ".join(f"{k} {v:6.1f}" for k, v in routing_times(T).items()), flush=True)
        return
    print(HEADER)
    rows = run_bench(tuple(int(t) for t in a.tokens.split(",")), ref=not a.no_ref, breakdown=a.breakdown)
    print()
    print_table(rows)


if __name__ == "__main__":
    main()
