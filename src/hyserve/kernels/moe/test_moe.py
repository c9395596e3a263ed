"""Fused MoE: reference vs a float64 per-token formula; Triton routing/grouping vs torch; every Triton path
(decode "reduce" with tensor-core dots, GEMV block_m < 16, prefill "scatter" with the multi-kernel
grouping, the few-token "pairs" path) vs the reference on fresh random inputs with NaN-poisoned outputs and workspaces.

CPU: TRITON_INTERPRET=1, small odd shapes, fp32 (ieee dots). CUDA: the same small fp32 tests compiled,
plus the real shapes (E=256, k=8,
H=2048, I=512, bf16) with a realistic router (N(0, 1/H) weights on RMS-normalised x); bf16 logits
tie often at the k-th boundary, so tokens whose reference top-k is tied there are compared on routing
only (any tie-break is a valid top-k).
"""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.moe import fused_moe, workspace
from hyserve.kernels.moe.configs import default_plan, fit_plan, get_plan
from hyserve.kernels.moe.reference import fused_moe_reference, route_reference

CUDA = torch.cuda.is_available()
# the small odd-shape tests run where the Triton path can: the interpreter on the CPU, compiled on a GPU
DEV = "cuda" if CUDA else "cpu"
SMALL = dict(E=8, H=48, I=40, device=DEV)


@pytest.fixture(autouse=True)
def _triton_env(monkeypatch):
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    if not CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(workspace, "POISON", True)


def make_inputs(
    T: int,
    E: int,
    H: int,
    I: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    dead: int = 0,
    shared_i: int | None = None,
    shared_gate: bool = True,
    realistic: bool = False,
    seed: int = 0,
) -> dict:
    """Random MoE weights; experts 0..dead-1 never win (a large positive feature they weigh negatively)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    x = rnd(T, H)
    if realistic:
        x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
        gate_weight = rnd(E, H, scale=H**-0.5)
    else:
        gate_weight = rnd(E, H)
    if dead:
        x[:, 0] = 4.0
        gate_weight[:dead, 0] = -40.0
    si = I if shared_i is None else shared_i
    d = dict(
        x=x,
        gate_weight=gate_weight,
        w_gate_up=rnd(E, 2 * I, H, scale=H**-0.5),
        w_down=rnd(E, H, I, scale=I**-0.5),
        shared_gate_up=rnd(2 * si, H, scale=H**-0.5) if si else None,
        shared_down=rnd(H, si, scale=si**-0.5) if si else None,
        shared_expert_gate=rnd(1, H, scale=H**-0.5) if (si and shared_gate) else None,
    )
    return {k: (v.to(device=device, dtype=dtype) if v is not None else None) for k, v in d.items()}


def moe_float64(d: dict, top_k: int) -> torch.Tensor:
    """The block, token by token, in float64: softmax -> top-k -> renormalise -> SwiGLU experts + shared."""
    f = {k: (v.double().cpu() if v is not None else None) for k, v in d.items()}
    x = f["x"]
    inter = f["w_gate_up"].shape[1] // 2
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        p = torch.softmax(f["gate_weight"] @ x[t], 0)
        w, ids = torch.topk(p, top_k)
        w = w / w.sum()
        for wj, e in zip(w.tolist(), ids.tolist()):
            gu = f["w_gate_up"][e] @ x[t]
            hidden = torch.nn.functional.silu(gu[:inter]) * gu[inter:]
            out[t] += wj * (f["w_down"][e] @ hidden)
        if f["shared_gate_up"] is not None:
            si = f["shared_gate_up"].shape[0] // 2
            gu = f["shared_gate_up"] @ x[t]
            s = f["shared_down"] @ (torch.nn.functional.silu(gu[:si]) * gu[si:])
            if f["shared_expert_gate"] is not None:
                s = s * torch.sigmoid(f["shared_expert_gate"][0] @ x[t])
            out[t] += s
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def max_rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def small_plan(block_m: int, mode: str, E: int = 8, H: int = 48, I: int = 40) -> dict:
    """Tiles that cover the small test dims in one program each (few interpreter programs)."""
    p = {
        "block_m": block_m,
        "down_mode": mode,
        "gate_up": {"BLOCK_I": 64, "BLOCK_K": 64},
        "down": {"BLOCK_H": 64, "BLOCK_K": 64},
    }
    return fit_plan(p, H, I)


def fused_sum_plan(block_h: int = 16) -> dict:
    """The prefill path with the sum in the down kernel's tail, over several H-tiles (H = 48: three counters a
    token)."""
    plan = small_plan(16, "scatter")
    return dict(plan, down={**plan["down"], "BLOCK_H": block_h, "fused_sum": True})


def tma_plan() -> dict:
    """The prefill path with the weights through tensor descriptors, in tiles that leave masked tails (H = 48
    over BLOCK_K 32, I = 40 over BLOCK_I 16 and BLOCK_K 16: the last boxes read past an expert's rows and past
    the tensor's columns) and several K steps."""
    return {
        "block_m": 16,
        "down_mode": "scatter",
        "gate_up": {"BLOCK_I": 16, "BLOCK_K": 32, "num_stages": 2, "TMA": 1},
        "down": {"BLOCK_H": 16, "BLOCK_K": 16, "num_stages": 2, "TMA": 1},
    }


def evict_plan(plan: dict) -> dict:
    """``plan`` with the L2 eviction hints of the grouped kernels on (``EVICT``: h and y kept, weights first)."""
    return dict(plan, gate_up={**plan["gate_up"], "EVICT": 1}, down={**plan["down"], "EVICT": 1})


def pairs_plan(fused_router: bool = False, H: int = 48, I: int = 40) -> dict:
    """The few-token path with tiles smaller than the small test dims (masked tails, several K loops)."""
    p = {
        "block_m": 1,
        "down_mode": "pairs",
        "fused_router": fused_router,
        "router_be": 4,
        "gate_up": {"BLOCK_I": 16, "BLOCK_K": 32},
        "down": {"BLOCK_H": 16, "BLOCK_I": 16},
    }
    return fit_plan(p, H, I)


def run_triton(d: dict, top_k: int, plan: dict | None = None, force_large: bool = False) -> torch.Tensor:
    from hyserve.kernels.moe.triton_moe import fused_moe_triton

    x = d["x"]
    out = torch.full_like(x, float("nan"))
    args = [d[k] for k in ("gate_weight", "w_gate_up", "w_down")]
    extra = [d[k] for k in ("shared_gate_up", "shared_down", "shared_expert_gate")]
    return fused_moe_triton(x, *args, top_k, *extra, plan=plan, force_large_routing=force_large, out=out)


def boundary_ties(d: dict, top_k: int) -> torch.Tensor:
    """[T] bool: the reference's k-th and (k+1)-th router logits are within one bf16 ulp (the top-k set
    is ambiguous: any tie-break is valid, and the fused router's fp32 sums may round 1 ulp apart)."""
    logits = torch.nn.functional.linear(d["x"], d["gate_weight"]).float()
    if logits.shape[1] <= top_k:
        return torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    s = logits.sort(-1, descending=True).values
    return (s[:, top_k - 1] - s[:, top_k]) <= s[:, top_k - 1].abs() * 2.0**-7


# ----------------------------------------------------------------------------- reference


@pytest.mark.parametrize("T", [1, 5, 33])
@pytest.mark.parametrize("top_k", [2, 3])
def test_reference_vs_float64(T: int, top_k: int) -> None:
    d = make_inputs(T, **SMALL, seed=T * 10 + top_k)
    ref = fused_moe_reference(
        d["x"],
        d["gate_weight"],
        d["w_gate_up"],
        d["w_down"],
        top_k,
        *[d[k] for k in ("shared_gate_up", "shared_down", "shared_expert_gate")],
    )
    assert rel_err(ref, moe_float64(d, top_k)) < 1e-5


# ----------------------------------------------------------------------------- routing


def _expected_meta(ids: torch.Tensor, E: int, bm: int, with_shared: bool) -> list[tuple[int, int, int]]:
    T = ids.shape[0]
    n = ids.numel()
    counts = torch.bincount(ids.flatten().long(), minlength=E).tolist()
    blocks = [(E, n + j, min(bm, T - j)) for j in range(0, T, bm)] if with_shared else []
    start = 0
    for e, c in enumerate(counts):
        for j in range(0, c, bm):
            blocks.append((e, start + j, min(bm, c - j)))
        start += c
    return blocks


# The large path takes 4 tokens a top-k program up to 1024 tokens (LARGE_BLOCK_T): ("large", 300) is 75 token
# blocks, five scan programs of 16 token blocks at E = 8; ("large16", 300) takes the 16 of larger T: 19 token
# blocks of 16, two scan programs
ROUTING_CASES = [(T, mode) for T in (1, 33, 100) for mode in ("small", "split", "large", "fused")]


@pytest.mark.parametrize(
    "T,mode", [*ROUTING_CASES, (300, "large"), (300, "large16"), (33, "atomic"), (300, "atomic")]
)
def test_routing_and_grouping(T: int, mode: str, monkeypatch) -> None:
    from hyserve.kernels.moe import router, routing

    E, top_k, bm = 8, 3, 4
    if mode == "large16":
        monkeypatch.setattr(routing, "LARGE_BLOCK_T", ((1 << 30, 16),))
    d = make_inputs(T, **SMALL, dead=2, seed=T)
    if mode == "fused":
        rt = router.route_and_align_fused(d["x"], d["gate_weight"], top_k, bm, True)
        assert int(router._counter(d["x"].device).item()) == 0  # reset for the next launch
    else:
        logits = torch.nn.functional.linear(d["x"], d["gate_weight"])
        large, atomic = mode.startswith("large") or mode == "atomic", mode == "atomic"
        rt = routing.route_and_align(
            logits, top_k, bm, True, d["x"].dtype, force_large=large, split=mode == "split", atomic=atomic
        )
    w_ref, ids_ref = route_reference(d["x"], d["gate_weight"], top_k)
    assert torch.equal(rt.topk_ids.long(), ids_ref)
    torch.testing.assert_close(rt.topk_weights, w_ref.float(), rtol=1e-5, atol=1e-6)
    assert not (rt.topk_ids < 2).any()  # the dead experts got no tokens
    order = torch.argsort(ids_ref.flatten(), stable=True)
    got = rt.sorted_pairs.long()
    if mode == "atomic":  # each expert's pairs in their atomics' order: the same set of pairs per expert
        assert int(routing.ticket_counters("moe_route_atomic", got.device, 9).abs().sum()) == 0  # reset
        got = got[torch.argsort(ids_ref.flatten()[got] * got.numel() + got)]
    assert torch.equal(got, order)
    blocks = _expected_meta(ids_ref, E, bm, True)
    mb = rt.max_blocks
    meta = rt.meta.tolist()
    assert meta[3 * mb] == len(blocks) <= mb
    got = [(meta[b], meta[mb + b], meta[2 * mb + b]) for b in range(len(blocks))]
    assert got == blocks


@pytest.mark.parametrize("block_e", [None, 4])
def test_route_topk_fused(block_e: int | None) -> None:
    from hyserve.kernels.moe import router

    d = make_inputs(3, **SMALL, seed=11)
    rt = router.route_topk_fused(d["x"], d["gate_weight"], 3, block_e)
    ids, w = rt.topk_ids, rt.topk_weights
    assert rt.normed_x is None
    assert int(router._counter(d["x"].device).item()) == 0
    w_ref, ids_ref = route_reference(d["x"], d["gate_weight"], 3)
    assert torch.equal(ids.long(), ids_ref)
    torch.testing.assert_close(w, w_ref.float(), rtol=1e-5, atol=1e-6)


def test_router_counter_is_made_once_per_device_and_never_inside_a_capture(monkeypatch) -> None:
    """A counter first allocated during a CUDA-graph capture lives in the graphs' shared pool, where other
    graphs' temporaries overwrite it (H200: an illegal address at batch 1 after a c=32 run)."""
    from hyserve.kernels import tickets
    from hyserve.kernels.moe import router

    monkeypatch.setattr(tickets, "_COUNTERS", {})
    cpu = torch.device("cpu")
    assert router._counter(cpu) is router._counter(cpu)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="before CUDA-graph capture"):
        router._counter(torch.device("cuda", 0))


def test_route_topk_only() -> None:
    from hyserve.kernels.moe.routing import route_topk

    d = make_inputs(9, **SMALL, seed=3)
    logits = torch.nn.functional.linear(d["x"], d["gate_weight"])
    ids, w = route_topk(logits, 3, torch.float32)
    w_ref, ids_ref = route_reference(d["x"], d["gate_weight"], 3)
    assert torch.equal(ids.long(), ids_ref)
    torch.testing.assert_close(w, w_ref, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- fused paths (CPU, small)

PATHS = {
    "decode": lambda T: (small_plan(16, "reduce"), False),
    "decode_fused_router": lambda T: (dict(small_plan(16, "reduce"), fused_router=True), False),
    "gemv": lambda T: (small_plan(1 if T == 1 else 8, "reduce"), False),
    "prefill": lambda T: (small_plan(16, "scatter"), True),
    "prefill_fused_sum": lambda T: (fused_sum_plan(), True),
    "prefill_tma": lambda T: (tma_plan(), True),
    "prefill_atomic_routing": lambda T: (dict(small_plan(16, "scatter"), atomic_routing=True), True),
    "prefill_evict": lambda T: (evict_plan(small_plan(16, "scatter")), True),
    "prefill_tma_evict": lambda T: (evict_plan(tma_plan()), True),
    "pairs": lambda T: (pairs_plan(), False),
    "pairs_fused_router": lambda T: (pairs_plan(fused_router=True), False),
    "pairs_split_shared": lambda T: (dict(pairs_plan(fused_router=True), split_shared=True), False),
    "pairs_topk_in_experts": lambda T: (dict(pairs_plan(fused_router=True), topk_in_experts=True), False),
    "pairs_topk_in_experts_split": lambda T: (
        dict(pairs_plan(fused_router=True), topk_in_experts=True, split_shared=True),
        False,
    ),
}


@pytest.mark.parametrize("T", [1, 5, 33])
@pytest.mark.parametrize("path", list(PATHS))
def test_triton_paths_vs_reference(T: int, path: str) -> None:
    d = make_inputs(T, **SMALL, dead=3 if T > 1 else 0, seed=100 + T)
    top_k = 3 if T != 5 else 2
    plan, force_large = PATHS[path](T)
    out = run_triton(d, top_k, plan, force_large)
    ref = fused_moe_reference(
        d["x"],
        d["gate_weight"],
        d["w_gate_up"],
        d["w_down"],
        top_k,
        *[d[k] for k in ("shared_gate_up", "shared_down", "shared_expert_gate")],
    )
    assert not out.isnan().any()
    assert max_rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize(
    "opts",
    [
        dict(REDUCE_EACH=1),
        dict(PREFETCH=1),
        dict(REDUCE_EACH=1, PREFETCH=1),
        dict(TMA=3),
        dict(TMA=2, REDUCE_EACH=1),
        dict(L2PF=4),
        dict(BCAST_X=1),
        dict(BCAST_X=1, REDUCE_EACH=1, PREFETCH=1),
        dict(PREFETCH=1, maxnreg=56),
        dict(SHARED_FIRST=1),
        dict(SHARED_FIRST=1, PREFETCH=1, L2PF=4),
    ],
)
def test_pairs_kernel_options(T: int, opts: dict) -> None:
    """The pairs kernels' plan options (fewer registers, one tile ahead, TMA copies, x in the tiles' layout and
    the shared expert's programs first: gate_up only) against the
    reference; tiles that leave masked tails in K and I (H = 48 over BLOCK_K 32, I = 40 over BLOCK_I 16: the
    last TMA box reads past the slice). L2PF (gate_up's L2 prefetch of the shared expert) runs on the GPU
    only."""
    d = make_inputs(T, **SMALL, dead=2 if T > 1 else 0, seed=400 + T)
    plan = pairs_plan()
    plan = dict(plan, gate_up={**plan["gate_up"], **opts}, down={**plan["down"], **opts})
    out = run_triton(d, 3, plan)
    args = [d[k] for k in ("gate_weight", "w_gate_up", "w_down")]
    ref = fused_moe_reference(
        d["x"], *args, 3, *[d[k] for k in ("shared_gate_up", "shared_down", "shared_expert_gate")]
    )
    assert not out.isnan().any()
    assert max_rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("path", [*PATHS, "shared_other_width", "chunked"])
def test_triton_paths_with_norm_and_residual(T: int, path: str, monkeypatch) -> None:
    """The decoder layer's call: ``residual += MoE(rms_norm(residual))``, the norm inside the fused router (which
    stores the normed x for the experts) or a separate kernel, the add in the down (or sum) kernel."""
    from hyserve.kernels.moe import triton_moe

    d = make_inputs(T, **SMALL, shared_i=24 if path == "shared_other_width" else None, seed=300 + T)
    gen = torch.Generator().manual_seed(T)
    norm_w = (torch.randn(SMALL["H"], generator=gen) * 0.3).to(DEV)
    x = (d["x"] * 3.0 + 0.5).contiguous()  # not unit RMS: the norm has work to do
    top_k = 3
    if path == "chunked":
        monkeypatch.setattr(triton_moe, "PREFILL_CHUNK", 2)
        plan, force_large = small_plan(16, "reduce"), False
    elif path == "shared_other_width":
        plan, force_large = pairs_plan(fused_router=True), False
    else:
        plan, force_large = PATHS[path](T)
    args = [d[k] for k in ("gate_weight", "w_gate_up", "w_down")]
    extra = [d[k] for k in ("shared_gate_up", "shared_down", "shared_expert_gate")]
    residual = x.clone()
    got = triton_moe.fused_moe_triton(
        residual, *args, top_k, *extra, plan=plan, force_large_routing=force_large,
        norm_weight=norm_w, norm_eps=1e-6, residual=residual,
    )  # fmt: skip
    want = fused_moe_reference(x, *args, top_k, *extra, norm_weight=norm_w, norm_eps=1e-6, residual=x.clone())
    assert got is residual and not got.isnan().any()
    assert max_rel_err(got - x, want - x) < 1e-5  # the MoE's part of the sum, to the reference's precision


@pytest.mark.parametrize("shared", [True, False])
def test_fused_sum_matches_the_sum_kernel(shared: bool) -> None:
    """The down kernel's ticketed sum gives the sum kernel's output bit for bit (same fp32 order), with and
    without the shared expert (k or k + 1 tickets a row), over several expert blocks and H-tiles; it leaves
    every counter at zero, so a second launch (a graph replay) gives the same output again."""
    from hyserve.kernels import tickets

    d = make_inputs(37, **SMALL, dead=2, seed=700)
    if not shared:
        d = dict(d, shared_gate_up=None, shared_down=None, shared_expert_gate=None)
    plan = small_plan(16, "scatter")
    plan = dict(plan, down={**plan["down"], "BLOCK_H": 16})
    two = run_triton(d, 3, plan, True)
    one = run_triton(d, 3, fused_sum_plan(), True)
    assert not one.isnan().any()
    assert torch.equal(one, two)
    assert int(tickets.ticket_counters("moe down sum", one.device, 1).abs().sum()) == 0
    assert torch.equal(run_triton(d, 3, fused_sum_plan(), True), one)


@pytest.mark.parametrize("T", [1, 4])
def test_topk_in_experts_routes_like_the_router(T: int) -> None:
    """The expert kernels' own top-k (``token_topk`` on the router's logits) picks the experts and weights the
    router's last program would: the outputs are bit-identical to the routed path's."""
    d = make_inputs(T, **SMALL, dead=2, seed=600 + T)
    plan = pairs_plan(fused_router=True)
    routed = run_triton(d, 3, plan)
    own = run_triton(d, 3, dict(plan, topk_in_experts=True))
    assert not own.isnan().any()
    assert torch.equal(own, routed)


def test_pairs_routing_operands_are_checked() -> None:
    from hyserve.kernels.moe.triton_pairs import down_pairs

    d = make_inputs(1, **SMALL, seed=1)
    h = torch.zeros(4, SMALL["I"], device=DEV)
    with pytest.raises(ValueError, match="top_k"):
        down_pairs(h, d["w_down"], None, None, {"BLOCK_H": 16, "BLOCK_I": 16}, logits=torch.zeros(1, 8))
    with pytest.raises(ValueError, match="fp32"):
        down_pairs(
            h, d["w_down"], None, None, {"BLOCK_H": 16, "BLOCK_I": 16}, logits=torch.zeros(1, 5), top_k=3
        )


def test_fused_router_stores_the_normed_x() -> None:
    from hyserve.kernels.moe import router
    from hyserve.kernels.rmsnorm.reference import rms_norm_reference

    for T, H, block_e in (
        (1, 48, 4),
        (3, 200, 8),
    ):  # one tile of H, and several (BK = 64 at T = 3, 8 experts)
        d = make_inputs(T, E=8, H=H, I=40, device=DEV, seed=T)
        norm_w = torch.randn(H, generator=torch.Generator().manual_seed(1)).to(DEV) * 0.3
        x = d["x"] * 2.0
        rt = router.route_topk_fused(x, d["gate_weight"], 3, block_e, norm_w, 1e-6)
        xn = rms_norm_reference(x, norm_w, 1e-6)
        torch.testing.assert_close(rt.normed_x, xn, rtol=1e-5, atol=1e-6)
        w_ref, ids_ref = route_reference(xn, d["gate_weight"], 3)
        assert torch.equal(rt.topk_ids.long(), ids_ref)
        torch.testing.assert_close(rt.topk_weights, w_ref.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "variant", ["no_shared", "no_shared_gate", "shared_other_width", "default_plan", "chunked", "empty"]
)
def test_triton_variants(variant: str, monkeypatch) -> None:
    T, top_k = 6, 2
    kw: dict = {}
    if variant == "no_shared":
        kw = dict(shared_i=0)
    elif variant == "no_shared_gate":
        kw = dict(shared_gate=False)
    elif variant == "shared_other_width":
        kw = dict(shared_i=24)
    if variant == "empty":
        T = 0
    if variant == "chunked":
        from hyserve.kernels.moe import triton_moe

        monkeypatch.setattr(triton_moe, "PREFILL_CHUNK", 4)
        T = 9
    d = make_inputs(T, **SMALL, seed=7, **kw)
    plan = None if variant == "default_plan" else small_plan(16, "reduce")
    out = run_triton(d, top_k, plan)
    if variant in ("no_shared", "no_shared_gate", "shared_other_width"):
        pairs = run_triton(d, top_k, pairs_plan())
        assert not pairs.isnan().any()
        assert max_rel_err(pairs, out) < 1e-5
    ref = fused_moe_reference(
        d["x"],
        d["gate_weight"],
        d["w_gate_up"],
        d["w_down"],
        top_k,
        *[d[k] for k in ("shared_gate_up", "shared_down", "shared_expert_gate")],
    )
    assert out.shape == ref.shape
    if T:
        assert not out.isnan().any()
        assert max_rel_err(out, ref) < 1e-5


def test_dispatch(monkeypatch) -> None:
    from hyserve.kernels.moe import triton_moe

    calls = []
    real = triton_moe.fused_moe_triton
    monkeypatch.setattr(triton_moe, "fused_moe_triton", lambda *a, **k: calls.append(1) or real(*a, **k))
    d = make_inputs(2, **SMALL, seed=1)
    args = (d["x"], d["gate_weight"], d["w_gate_up"], d["w_down"], 2)
    fused_moe(*args)
    assert calls
    monkeypatch.setenv("HYSERVE_KERNELS", "reference")
    torch.testing.assert_close(fused_moe(*args), fused_moe_reference(*args))
    assert len(calls) == 1


# ----------------------------------------------------------------------------- real shapes (CUDA)


PAIRS_REAL = {
    "block_m": 1,
    "down_mode": "pairs",
    "gate_up": {"BLOCK_I": 16, "BLOCK_K": 512, "num_warps": 4},
    "down": {"BLOCK_H": 8, "BLOCK_I": 128, "num_warps": 4},
}


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 3, 8, 32, 64, 200, 1024])
@pytest.mark.parametrize("path", ["auto", "unfused_router", "gemv", "prefill", "prefill_evict", "pairs"])
def test_real_shapes_cuda(T: int, path: str) -> None:
    E, top_k, H, I = 256, 8, 2048, 512
    if path in ("gemv", "unfused_router", "pairs") and T > 64:
        pytest.skip("decode variants")
    d = make_inputs(T, E, H, I, dtype=torch.bfloat16, device="cuda", realistic=True, seed=T)
    if path == "auto":
        plan, force = None, False
    elif path == "unfused_router":
        plan, force = dict(get_plan(T, E, H, I, top_k, torch.bfloat16), fused_router=False), False
    elif path == "pairs":
        plan, force = fit_plan(dict(PAIRS_REAL, fused_router=T <= 8), H, I), False
    elif path == "gemv":
        # the tuned table picks pairs at T <= 8, whose tiles do not fit the GEMV kernels: untuned tiles
        plan = fit_plan(dict(default_plan(T, E, H, I, top_k), block_m=1 if T == 1 else 4), H, I)
        force = False
    else:
        plan = fit_plan(dict(get_plan(max(T, 256), E, H, I, top_k, torch.bfloat16)), H, I)
        plan["down_mode"], plan["block_m"] = "scatter", max(16, plan["block_m"])
        plan = evict_plan(plan) if path == "prefill_evict" else plan
        force = True
    out = run_triton(d, top_k, plan, force)
    ref = fused_moe_reference(
        d["x"],
        d["gate_weight"],
        d["w_gate_up"],
        d["w_down"],
        top_k,
        *[d[k] for k in ("shared_gate_up", "shared_down", "shared_expert_gate")],
    )
    ok = ~boundary_ties(d, top_k)
    assert ok.float().mean() > 0.5
    assert not out.isnan().any()
    assert rel_err(out[ok], ref[ok]) < 1e-2
    assert max_rel_err(out[ok], ref[ok]) < 5e-2


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("T", [128, 1024])
def test_grouped_l2_prefetch_changes_nothing(T: int) -> None:
    """The grouped gate_up's L2 prefetch of the first blocks' weights (cfg ``L2PF`` programs, ``L2PF_E`` routed
    experts; the interpreter never runs it) is a hint: the same output, bit for bit."""
    E, top_k, H, I = 256, 8, 2048, 512
    d = make_inputs(T, E, H, I, dtype=torch.bfloat16, device="cuda", realistic=True, seed=T)
    plan = fit_plan(dict(get_plan(max(T, 256), E, H, I, top_k, torch.bfloat16)), H, I)
    plan["down_mode"], plan["block_m"] = "scatter", max(16, plan["block_m"])
    prefetch = dict(plan, gate_up={**plan["gate_up"], "L2PF": 132, "L2PF_E": 4})
    assert torch.equal(run_triton(d, top_k, prefetch, True), run_triton(d, top_k, plan, True))


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 4, 32])
@pytest.mark.parametrize("variant", ["plan", "split_shared", "norm_residual", "topk_in_experts"])
def test_cuda_graph_and_determinism(T: int, variant: str, monkeypatch) -> None:
    """Replays of a captured MoE match eager runs bit for bit, also when the input changes between replays
    and against plain launches (``HYSERVE_PDL=0``): a kernel reading the routing (or any input) before the
    previous kernel wrote it (the loads before the PDL wait, kernels/pdl.py) would compute with the previous
    replay's experts. Variants: the tuned plan; with ``split_shared`` (the routed gate_up streams before its
    wait); the decoder layer's call (the pre-norm in the router, the residual stream updated in place); with
    ``topk_in_experts`` (the down kernel takes its top-k from the router's logits before its wait)."""
    from hyserve.kernels.moe import triton_moe

    if variant in ("split_shared", "topk_in_experts"):
        if T > 8:
            pytest.skip(f"{variant} is a pairs-path (T <= 8) option")
        real = triton_moe.get_plan
        monkeypatch.setattr(triton_moe, "get_plan", lambda *a: dict(real(*a), **{variant: True}))
    E, top_k, H, I = 256, 8, 2048, 512
    d = make_inputs(T, E, H, I, dtype=torch.bfloat16, device="cuda", realistic=True, seed=5)
    args = (d["gate_weight"], d["w_gate_up"], d["w_down"], top_k, d["shared_gate_up"], d["shared_down"])
    norm_w = torch.randn(H, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7)) * 0.1
    norm_w = norm_w.to(torch.bfloat16)
    xs = d["x"].clone()  # the captured input (and, for norm_residual, the residual stream it updates)

    def call(x: torch.Tensor) -> torch.Tensor:
        if variant == "norm_residual":
            return fused_moe(x, *args, d["shared_expert_gate"], norm_weight=norm_w, norm_eps=1e-6, residual=x)
        return fused_moe(x, *args, d["shared_expert_gate"])

    first = call(d["x"].clone())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = call(xs)
    xs.copy_(d["x"])
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first)
    gen = torch.Generator(device="cuda").manual_seed(6)
    for _ in range(4):
        x = torch.randn(T, H, device="cuda", generator=gen)
        x = (x / x.pow(2).mean(-1, keepdim=True).sqrt()).to(torch.bfloat16)
        monkeypatch.setenv("HYSERVE_PDL", "0")
        expected = call(x.clone()).clone()
        monkeypatch.delenv("HYSERVE_PDL")
        if variant != "norm_residual":
            out.fill_(float("nan"))
        xs.copy_(x)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)


def test_tune_merge_keeps_what_the_tuner_does_not_choose(capsys):
    """``tune.py --merge``: a re-tuned bucket keeps the old plan's A/B keys (``atomic_routing`` here) and takes the new
    tiles whole, saying which step-tuner options of the old tiles it dropped; untouched buckets stay as they were."""
    from hyserve.kernels.moe.tune import merge_buckets

    old = {
        "1": {
            "block_m": 1,
            "down_mode": "pairs",
            "gate_up": {"BLOCK_I": 4, "L2PF": 64, "maxnreg": 56},
            "down": {},
        },
        "1024": {"block_m": 64, "atomic_routing": True, "gate_up": {"BLOCK_I": 16}, "down": {"BLOCK_H": 16}},
    }
    new = {"1": {"block_m": 1, "down_mode": "pairs", "gate_up": {"BLOCK_I": 8}, "down": {"BLOCK_H": 2}}}
    merged = merge_buckets(old, new)
    assert merged["1024"] == old["1024"]
    assert merged["1"] == {
        "block_m": 1,
        "down_mode": "pairs",
        "gate_up": {"BLOCK_I": 8},
        "down": {"BLOCK_H": 2},
    }
    assert capsys.readouterr().out == "bucket 1: gate_up options of the old tiles dropped: L2PF, maxnreg\n"
    again = merge_buckets(
        old, {"1024": {"block_m": 128, "gate_up": {"BLOCK_I": 32}, "down": {"BLOCK_H": 16}}}
    )
    assert again["1024"] == {
        "block_m": 128,
        "atomic_routing": True,
        "gate_up": {"BLOCK_I": 32},
        "down": {"BLOCK_H": 16},
    }
