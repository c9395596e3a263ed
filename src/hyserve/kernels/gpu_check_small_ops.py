"""H200 check of the attention and small fused-op kernels: correctness at the model's shapes, then benches.

``PYTHONPATH=src python3 -m hyserve.kernels.gpu_check_small_ops [--no-sweep] [--no-bench]`` (< 3 minutes).

1. correctness (bf16, real shapes) of every Triton op against its reference: paged decode (B=32, contexts
   1..8192, pages 16/64/256), varlen prefill with cached prefixes and decode rows, store_kv (padding slots
   untouched), rms_norm (+residual), gated_rms_norm, qk_norm_rope on the strided q view, silu_and_mul;
2. a CUDA-graph capture of a decode step (qk_norm_rope_store, paged_attention) replayed with new
   lengths and block tables (no host reads, static grid);
3. the benches of all five ops and, unless --no-sweep, a tile-config sweep of the attention kernels.
A short table comes last; every row also goes to $OUT/small_ops.json when $OUT is set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import traceback

import torch

from hyserve.kernels.testing import rel_err

BF16_TOL = 1.5e-2


class Report:
    def __init__(self) -> None:
        self.checks: list[dict] = []
        self.benches: list[dict] = []
        self.notes: list[str] = []

    def check(self, name: str, err: float, tol: float = BF16_TOL, extra: str = "") -> None:
        ok = bool(err < tol) and not math.isnan(err)
        self.checks.append(dict(name=name, rel_err=err, tol=tol, ok=ok))
        print(f"[{'ok' if ok else 'FAIL'}] {name}: rel err {err:.2e} (tol {tol:.0e}) {extra}", flush=True)

    def guard(self, name: str, fn) -> None:
        try:
            fn()
        except Exception:
            self.checks.append(dict(name=name, rel_err=float("nan"), tol=0.0, ok=False))
            print(f"[FAIL] {name}: exception\n{traceback.format_exc()}", flush=True)


def _paged(ctx: list[int], qlen: list[int], page: int, seed: int = 0, hq=16, hkv=2, d=256):
    """A shuffled paged cache (NaN in unowned slots) with the given contexts, and random queries/gates."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    n_blocks = [math.ceil(c / page) for c in ctx]
    num_blocks = sum(n_blocks) + 2
    kc = torch.full((num_blocks, page, hkv, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    vc = torch.full_like(kc, float("nan"))
    perm = torch.randperm(num_blocks, device="cuda", generator=gen).int()
    bt = torch.full((len(ctx), max(n_blocks) + 1), -1, dtype=torch.int32, device="cuda")
    used, slots = 0, []
    for i, (c, nb) in enumerate(zip(ctx, n_blocks)):
        bt[i, :nb] = perm[used : used + nb]
        used += nb
        t = torch.arange(c, device="cuda")
        slots.append(bt[i, t // page].long() * page + t % page)
    slots = torch.cat(slots)
    for cache in (kc, vc):
        cache.view(-1, hkv, d)[slots] = torch.randn(
            len(slots), hkv, d, device="cuda", generator=gen
        ).bfloat16()
    t = sum(qlen)
    q = torch.randn(t, hq, d, device="cuda", generator=gen).bfloat16()
    gate = (2 * torch.randn(t, hq * d, device="cuda", generator=gen)).bfloat16()
    cu = torch.tensor([0, *torch.tensor(qlen).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    sl = torch.tensor(ctx, dtype=torch.int32, device="cuda")
    return (q, kc, vc, cu, sl, bt, d**-0.5), gate


def check_attention(rep: Report) -> None:
    from hyserve.kernels import paged_attention
    from hyserve.kernels.attention import paged_attention_reference, store_kv_reference
    from hyserve.kernels.attention.triton_store_kv import store_kv_triton

    gen = torch.Generator().manual_seed(0)
    for batch, page in ((32, 16), (32, 64), (5, 256), (1, 16)):
        ctx = torch.randint(1, 8193, (batch,), generator=gen).tolist()
        ctx[0] = 8192
        if batch > 3:
            ctx[1], ctx[2] = 1, 256
        args, gate = _paged(ctx, [1] * batch, page, seed=batch + page)
        ref = paged_attention_reference(*args, gate=gate)
        for max_len in (None, 8192):
            out = paged_attention(*args, gate=gate, max_seq_len=max_len)
            rep.check(f"decode B={batch} page={page} max_seq_len={max_len}", rel_err(out, ref))
    args, gate = _paged([200, 17, 256], [1, 1, 1], 16, seed=3)  # single-pass path
    out = paged_attention(*args, gate=gate, max_seq_len=256)
    rep.check("decode short contexts (one pass)", rel_err(out, paged_attention_reference(*args, gate=gate)))

    for page in (16, 128):
        ctx, qlen = [4096, 3000, 1500, 700, 1, 33], [4096, 900, 1500, 1, 1, 17]
        args, gate = _paged(ctx, qlen, page, seed=page)
        ref = paged_attention_reference(*args, gate=gate)
        rep.check(f"prefill mixed T={sum(qlen)} page={page}", rel_err(paged_attention(*args, gate=gate), ref))
        proj = torch.cat([args[0], gate.view(args[0].shape)], dim=-1)  # gate as the strided q_proj half
        rep.check(
            f"prefill gate view page={page}", rel_err(paged_attention(*args, gate=proj[..., 256:]), ref)
        )

    t, page, nb = 4096, 16, 300
    base = torch.randn(nb, page, 2, 256, device="cuda").bfloat16()
    k = torch.randn(t, 2, 256, device="cuda").bfloat16()
    v = torch.randn(t, 2, 256, device="cuda").bfloat16()
    slots = torch.randperm(nb * page, device="cuda")[:t]
    slots[::7] = -1
    kc, vc, kr, vr = base.clone(), base.clone(), base.clone(), base.clone()
    store_kv_triton(k, v, kc, vc, slots)
    store_kv_reference(k, v, kr, vr, slots)
    rep.check(
        "store_kv T=4096 (exact, padding skipped)",
        0.0 if torch.equal(kc, kr) and torch.equal(vc, vr) else 1.0,
        0.5,
    )


def check_cuda_graph(rep: Report) -> None:
    """Capture qk_norm_rope_store + decode attention once (the model's attention block); replay with other
    lengths and tables."""
    for batch, max_seq_len in ((32, None), (32, 8192), (1, None)):
        _graph_case(rep, batch, max_seq_len)


def _graph_case(rep: Report, batch: int, max_seq_len: int | None) -> None:
    from hyserve.kernels import paged_attention, qk_norm_rope_store, rope_cos_sin
    from hyserve.kernels.attention import paged_attention_reference

    page, width, hq, hkv, d = 16, 512, 16, 2, 256
    num_blocks = batch * width + 1
    kc = torch.randn(num_blocks, page, hkv, d, device="cuda").bfloat16()
    vc = torch.randn_like(kc)
    proj = torch.randn(batch, hq, 2 * d, device="cuda").bfloat16()
    k_new = torch.randn(batch, hkv, d, device="cuda").bfloat16()
    v_new = torch.randn_like(k_new)
    qw = (0.1 * torch.randn(d, device="cuda")).bfloat16()
    kw = (0.1 * torch.randn(d, device="cuda")).bfloat16()
    positions = torch.zeros(batch, dtype=torch.int64, device="cuda")
    seq_lens = torch.ones(batch, dtype=torch.int32, device="cuda")
    bt = torch.zeros(batch, width, dtype=torch.int32, device="cuda")
    slots = torch.zeros(batch, dtype=torch.int64, device="cuda")
    cu = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    cos, sin = rope_cos_sin(torch.arange(width * page, device="cuda"), 64, 1e7)

    def step():
        q = qk_norm_rope_store(
            proj[..., :d], k_new, v_new, qw, kw, 1e-6, cos, sin, positions, 64, kc, vc, slots
        )
        o = paged_attention(q, kc, vc, cu, seq_lens, bt, d**-0.5, gate=proj[..., d:], max_seq_len=max_seq_len)
        return q, o

    def fill(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        lens = torch.randint(1, width * page + 1, (batch,), generator=g)
        lens[0] = width * page if seed % 2 else 1
        seq_lens.copy_(lens.int())
        positions.copy_(lens - 1)
        bt.copy_(torch.randperm(num_blocks - 1, generator=g)[: batch * width].view(batch, width).int())
        last = lens - 1
        slots.copy_(bt.cpu().long().gather(1, (last // page)[:, None])[:, 0] * page + last % page)
        proj.normal_()
        k_new.normal_()
        v_new.normal_()

    fill(0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q_static, o_static = step()
    for seed in (1, 2):
        fill(seed)
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_attention_reference(q_static, kc, vc, cu, seq_lens, bt, d**-0.5, gate=proj[..., d:])
        rep.check(
            f"CUDA graph decode B={batch} max_seq_len={max_seq_len} replay {seed}", rel_err(o_static, ref)
        )


def check_small_ops(rep: Report) -> None:
    from hyserve.kernels import gated_rms_norm, qk_norm_rope, rms_norm, rope_cos_sin, silu_and_mul
    from hyserve.kernels.activation import silu_and_mul_reference
    from hyserve.kernels.gated_rmsnorm import gated_rms_norm_reference
    from hyserve.kernels.qk_norm_rope import qk_norm_rope_reference
    from hyserve.kernels.rmsnorm import rms_norm_reference

    bf = dict(device="cuda", dtype=torch.bfloat16)
    for t in (1, 37, 4096):
        x, r = 3 * torch.randn(t, 2048, **bf), torch.randn(t, 2048, **bf)
        w = 0.3 * torch.randn(2048, **bf)
        out, h = rms_norm(x, w, 1e-6, r)
        want, want_h = rms_norm_reference(x, w, 1e-6, r)
        rep.check(f"rms_norm+residual T={t}", rel_err(out, want), 8e-3)
        rep.check(f"rms_norm residual sum T={t} (exact)", 0.0 if torch.equal(h, want_h) else 1.0, 0.5)
        rep.check(f"rms_norm T={t}", rel_err(rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6)), 8e-3)

        z = torch.randn(t, 32, 128, **bf)
        o = torch.randn(t, 32, 128, **bf)
        for wd in (torch.bfloat16, torch.float32):
            gw = (1 + 0.2 * torch.randn(128, device="cuda")).to(wd)
            rep.check(
                f"gated_rms_norm T={t} w={str(wd)[6:]}",
                rel_err(gated_rms_norm(o, z, gw, 1e-6), gated_rms_norm_reference(o, z, gw, 1e-6)),
                8e-3,
            )

        proj = 2 * torch.randn(t, 16, 512, **bf)
        k = torch.randn(t, 2, 256, **bf)
        qw, kw = 0.2 * torch.randn(256, **bf), 0.2 * torch.randn(256, **bf)
        cos, sin = rope_cos_sin(torch.arange(100000, device="cuda"), 64, 1e7)
        pos = torch.randint(0, 100000, (t,), device="cuda")
        got = qk_norm_rope(proj[..., :256], k, qw, kw, 1e-6, cos, sin, pos, 64)
        want = qk_norm_rope_reference(proj[..., :256], k, qw, kw, 1e-6, cos, sin, pos, 64)
        rep.check(f"qk_norm_rope q T={t}", rel_err(got[0], want[0]))
        rep.check(f"qk_norm_rope k T={t}", rel_err(got[1], want[1]))

        xa = 2 * torch.randn(t, 1024, **bf)
        rep.check(f"silu_and_mul T={t}", rel_err(silu_and_mul(xa), silu_and_mul_reference(xa)), 8e-3)


def run_benches(rep: Report, sweep: bool, start_time: float, sweep_after_s: float = 110.0) -> None:
    from hyserve.kernels.activation import bench as act_bench
    from hyserve.kernels.argmax import bench as argmax_bench
    from hyserve.kernels.attention import bench as attn_bench
    from hyserve.kernels.gated_rmsnorm import bench as gated_bench
    from hyserve.kernels.qk_norm_rope import bench as rope_bench
    from hyserve.kernels.rmsnorm import bench as norm_bench

    for name, module in (
        ("attention", attn_bench),
        ("rmsnorm", norm_bench),
        ("gated_rmsnorm", gated_bench),
        ("qk_norm_rope", rope_bench),
        ("activation", act_bench),
        ("logits_argmax", argmax_bench),
    ):
        start = time.time()
        try:
            rows = module.run()
        except Exception:
            print(f"bench {name} failed\n{traceback.format_exc()}", flush=True)
            continue
        rep.benches.extend(rows)
        print(f"--- bench {name} ({time.time() - start:.0f} s)")
        print(attn_bench.format_rows(rows), flush=True)
    if sweep and time.time() - start_time > sweep_after_s:
        rep.notes.append(f"sweep skipped: {time.time() - start_time:.0f} s already spent")
        print(rep.notes[-1], flush=True)
    elif sweep:
        start = time.time()
        try:
            best = attn_bench.sweep(log=lambda s: (print(s, flush=True), rep.notes.append(s)))
            rep.notes.append("sweep best: " + json.dumps(best))
        except Exception:
            print(f"sweep failed\n{traceback.format_exc()}", flush=True)
        print(f"--- sweep ({time.time() - start:.0f} s)")


def summary(rep: Report, elapsed: float) -> str:
    lines = ["", "=" * 100, f"SMALL-OPS GPU CHECK ({elapsed:.0f} s)"]
    bad = [c for c in rep.checks if not c["ok"]]
    worst = max((c["rel_err"] for c in rep.checks if c["ok"]), default=0.0)
    lines.append(
        f"correctness: {len(rep.checks) - len(bad)}/{len(rep.checks)} ok (worst passing rel err {worst:.1e})"
    )
    lines += [f"  FAIL {c['name']} rel={c['rel_err']:.2e}" for c in bad]
    lines.append(
        f"{'op':<22}{'shape':<18}{'us':>9}{'GB/s|TF/s':>11}{'% roof':>8}{'torch us':>10}{'ref us':>10}"
    )
    for r in rep.benches:
        if r["op"] == "decode":
            shape = f"B={r['B']} ctx={r['ctx']}"
        elif r["op"] == "prefill":
            shape = f"T={r['T']} pre={r['prefix']}"
        else:
            shape = f"T={r['T']}"
        rate = r.get("GBps", r.get("TFLOPs", 0.0))
        pct = r.get("pct_hbm", r.get("pct_peak", 0.0))
        torch_us = r.get("sdpa_us", float("nan"))
        ref_us = r.get("ref_us", float("nan"))
        lines.append(
            f"{r['op']:<22}{shape:<18}{r['us']:>9.1f}{rate:>11.1f}{pct:>8.1f}{torch_us:>10.1f}{ref_us:>10.1f}"
        )
    lines += [n for n in rep.notes if n.startswith(("sweep best", "sweep skipped"))]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--no-bench", action="store_true")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    start = time.time()
    torch.manual_seed(0)
    rep = Report()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    for name, fn in (
        ("attention", check_attention),
        ("cuda graph", check_cuda_graph),
        ("small ops", check_small_ops),
    ):
        t0 = time.time()
        rep.guard(name, lambda fn=fn: fn(rep))
        print(f"--- {name} checks ({time.time() - t0:.0f} s)", flush=True)
    if not args.no_bench:
        run_benches(rep, sweep=not args.no_sweep, start_time=start)
    text = summary(rep, time.time() - start)
    print(text)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "small_ops.json"), "w") as f:
            json.dump(dict(checks=rep.checks, benches=rep.benches, notes=rep.notes), f, indent=1)
        with open(os.path.join(out, "small_ops_summary.txt"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
