"""One-off probe: the batch-1 decode step's graph replay with single ops taken out of the captured step (their
outputs replaced by fixed buffers), to bound what fusing them away could save. Timing only: the tokens are
meaningless. usage: python scripts/probe_removal.py --model DIR --load-format dummy --kv-cache-memory-gb 8
--max-num-seqs 8 --max-model-len 8192"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

spec = importlib.util.spec_from_file_location("tune_step", Path(__file__).parent / "tune_step.py")
tune_step = importlib.util.module_from_spec(spec)
sys.modules["tune_step"] = tune_step
spec.loader.exec_module(tune_step)

from hyserve import kernels as ops  # noqa: E402
from hyserve.kernels.moe import router, triton_moe  # noqa: E402

_fixed: dict = {}


def buf(shape, dtype, device):
    """A fixed buffer per shape and dtype, made before any capture (``prepare``): a capture may not allocate
    from the host's view or sync."""
    return _fixed[(tuple(shape), dtype)]


def prepare(device) -> None:
    """The buffers of the batch-1 step's shapes (Qwen3.6-35B-A3B): routing, xn, the DeltaNet and attention
    outputs."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    for shape, dtype in (
        ((1, 2048), torch.bfloat16),
        ((1, 32, 128), torch.bfloat16),
        ((1, 16, 256), torch.bfloat16),
    ):
        _fixed[(shape, dtype)] = torch.randn(shape, generator=gen).to(dtype).to(device)
    _fixed[((1, 8), torch.int32)] = (torch.arange(8) * 29 % 256).int().view(1, 8).to(device)
    _fixed[((1, 8), torch.float32)] = torch.full((1, 8), 1.0 / 8).to(device)


def fixed_routing(x, top_k, xn=None):
    t = x.shape[0]
    ids = buf((t, top_k), torch.int32, x.device)
    w = buf((t, top_k), torch.float32, x.device)
    return SimpleNamespace(
        topk_ids=ids, topk_weights=w, normed_x=xn if xn is not None else buf(x.shape, x.dtype, x.device)
    )


_real = {
    "route": triton_moe.route_topk_fused,
    "gdn": ops.gdn_decode_step,
    "qk": ops.qk_norm_rope_store,
    "paged": ops.paged_attention,
}


def no_router(x, gate_weight, top_k, block_e=None, norm_weight=None, norm_eps=0.0):
    if x.shape[0] != 1:
        return _real["route"](x, gate_weight, top_k, block_e, norm_weight, norm_eps)
    return fixed_routing(x, top_k)


def logits_only(x, gate_weight, top_k, block_e=None, norm_weight=None, norm_eps=0.0):
    if x.shape[0] != 1:
        return _real["route"](x, gate_weight, top_k, block_e, norm_weight, norm_eps)
    _, xn = router.router_logits_fused(x, gate_weight, top_k, block_e, norm_weight, norm_eps)
    return fixed_routing(x, top_k, xn)


def no_gdn_step(mixed_qkv, z, *rest):
    if z.shape[0] != 1:
        return _real["gdn"](mixed_qkv, z, *rest)
    return buf(z.shape, z.dtype, z.device)


def no_qk_store(q, *rest):
    if q.shape[0] != 1:
        return _real["qk"](q, *rest)
    return buf(q.shape, q.dtype, q.device)


def no_paged(q, *rest, **kw):
    if q.shape[0] != 1:
        return _real["paged"](q, *rest, **kw)
    return buf(q.shape, q.dtype, q.device)


@contextlib.contextmanager
def patched(pairs):
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in pairs]
    for obj, name, fn in pairs:
        setattr(obj, name, fn)
    try:
        yield
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)


VARIANTS = {
    "baseline": [],
    "no router (fixed ids, weights, xn)": [(triton_moe, "route_topk_fused", no_router)],
    "router without its ticket + top-k tail": [(triton_moe, "route_topk_fused", logits_only)],
    "no DeltaNet step": [(ops, "gdn_decode_step", no_gdn_step)],
    "no q/k-norm+RoPE+store, no paged attention": [
        (ops, "qk_norm_rope_store", no_qk_store),
        (ops, "paged_attention", no_paged),
    ],
    "no paged attention (split + reduce)": [(ops, "paged_attention", no_paged)],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    tune_step.add_engine_arguments(parser, model_required=True)
    parser.add_argument("--replays", type=int, default=300)
    ns = parser.parse_args()
    ns.batch, ns.prompt_len = 1, 384
    ns.cuda_graph_sizes, ns.prefill_graph_sizes, ns.warmup = "1", "none", False
    bench = tune_step.StepBench(ns)
    prepare(torch.device("cuda"))
    state = bench.state()
    rows = []
    for name, pairs in [*VARIANTS.items(), ("baseline again", [])]:
        with patched(pairs):
            us = bench.measure(state)
        rows.append((name, us))
        print(f"{name:48s} {us:8.1f} us", flush=True)
    base = (rows[0][1] + rows[-1][1]) / 2
    print(f"\n{'variant':48s} {'replay us':>10s} {'saved us':>9s}")
    for name, us in rows:
        print(f"{name:48s} {us:10.1f} {base - us:9.1f}")


if __name__ == "__main__":
    main()
