"""Micro-benchmark of the attention kernels at the model's shapes (Hq=16, Hkv=2, D=256, bf16, page 16).

``python -m hyserve.kernels.attention.bench [--sweep | --sweep-prefill | --fused | --qk]``. Decode (B x ctx) is timed inside a CUDA
graph (as the engine runs it): KV bytes / time against 4.0 TB/s, beside torch SDPA on contiguous K/V and the
reference. Prefill (T new tokens, optional cached prefix) is timed eagerly: TFLOP/s against 728, beside
torch SDPA (flash backend) on contiguous K/V (``sdpa_us``) and ``causal_attention``, the engine's path for a
prompt without a cached prefix, in a CUDA graph (``causal_us``: cuDNN, as the prefill graphs run it) and eagerly
(``causal_eager_us``: flash). ``--sweep`` tries tile configs and prints the best as JSON
for ``configs/attention.json``. ``--fused`` times the decode with the split partitions merged by a reduce
launch (fused=0) and by the split kernel's last program (fused=1: the config's ``fused_reduce``) only; ``--qk``
``decode_attention`` as two kernels and as one (the config's ``fused_qk``) only.
"""

from __future__ import annotations

import argparse
import functools
import json
import math

import torch
import torch.nn.functional as F

from hyserve.kernels.attention import graph_backend, launch_config, paged_attention_reference
from hyserve.kernels.attention.triton_decode import paged_decode
from hyserve.kernels.attention.triton_prefill import paged_prefill

HBM = 4.0e12
PEAK = 728e12
HQ, HKV, D = 16, 2, 256
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU (interpreter) only smoke-tests this file
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16


def time_ms(fn, graph: bool = True, rep: int = 20) -> float:
    """Median milliseconds of ``fn``: replayed from a CUDA graph (no launch overhead) or eagerly."""
    import triton.testing as tt

    if DEVICE != "cuda":
        import time

        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    if graph:
        try:
            return tt.do_bench_cudagraph(fn, rep=rep, return_mode="median")
        except Exception:  # capture failed: fall back to eager (reported as such by the caller's numbers)
            torch.cuda.synchronize()
    return tt.do_bench(fn, warmup=10, rep=rep, return_mode="median")


COLD_BYTES = 256 << 20  # rotate over this much K/V so repeated calls do not hit the L2 (50 MB)


class PagedBatch:
    """B sequences of the given contexts in a shuffled paged cache, and their new-token queries/gates.

    ``copies`` block tables address disjoint blocks of one pool; ``args()`` cycles through them so that
    back-to-back calls (a CUDA graph of many calls) read cold K/V, as a decode step does.
    """

    def __init__(
        self, ctx: list[int], qlen: list[int], page: int = 16, dtype=DTYPE, seed: int = 0, copies: int = 1
    ):
        dev = DEVICE
        gen = torch.Generator(device=dev).manual_seed(seed)
        n_blocks = [math.ceil(c / page) for c in ctx]
        total = sum(n_blocks)
        self.k_cache = torch.randn(copies * total, page, HKV, D, device=dev, dtype=dtype, generator=gen)
        self.v_cache = torch.randn(copies * total, page, HKV, D, device=dev, dtype=dtype, generator=gen)
        self.tables = []
        for c in range(copies):
            perm = c * total + torch.randperm(total, device=dev, generator=gen).int()
            table = torch.zeros(len(ctx), max(n_blocks), dtype=torch.int32, device=dev)
            used = 0
            for i, nb in enumerate(n_blocks):
                table[i, :nb] = perm[used : used + nb]
                used += nb
            self.tables.append(table)
        self.block_tables = self.tables[0]
        self._next = 0
        t = sum(qlen)
        self.q = torch.randn(t, HQ, D, device=dev, dtype=dtype, generator=gen)
        self.gate = torch.randn(t, HQ * D, device=dev, dtype=dtype, generator=gen)
        self.cu = torch.tensor([0, *torch.tensor(qlen).cumsum(0).tolist()], dtype=torch.int32, device=dev)
        self.seq_lens = torch.tensor(ctx, dtype=torch.int32, device=dev)
        self.ctx, self.qlen, self.page = ctx, qlen, page

    def args(self):
        table = self.tables[self._next]
        self._next = (self._next + 1) % len(self.tables)
        return (self.q, self.k_cache, self.v_cache, self.cu, self.seq_lens, table, D**-0.5, self.gate)


def _sdpa_decode(b: PagedBatch):
    """torch SDPA on contiguous K/V [B, Hkv, ctx, D] (all sequences of one length), GQA native, cold K/V."""
    n, ctx = len(b.ctx), b.ctx[0]
    q = b.q.view(n, HQ, 1, D)
    copies = len(b.tables)
    k = torch.randn(copies, n, HKV, ctx, D, device=DEVICE, dtype=b.q.dtype)
    v = torch.randn_like(k)
    state = {"i": 0}
    try:
        F.scaled_dot_product_attention(q, k[0], v[0], enable_gqa=True)
        gqa = True
    except Exception:
        gqa = False

    def run():
        i = state["i"] = (state["i"] + 1) % copies
        if gqa:
            return F.scaled_dot_product_attention(q, k[i], v[i], enable_gqa=True)
        rep = HQ // HKV
        return F.scaled_dot_product_attention(
            q, k[i].repeat_interleave(rep, 1), v[i].repeat_interleave(rep, 1)
        )

    return run


@functools.lru_cache(maxsize=6)
def _batch(ctx: tuple[int, ...], qlen: tuple[int, ...], page: int, cold: bool = False) -> PagedBatch:
    kv = sum(ctx) * HKV * D * 2 * 2
    copies = max(1, min(1024, COLD_BYTES // kv)) if cold and DEVICE == "cuda" else 1
    return PagedBatch(list(ctx), list(qlen), page, copies=copies)


def bench_decode(
    batch: int, ctx: int, page: int = 16, reference: bool = True, baseline: bool = True, rep: int = 20, **cfg
) -> dict:
    """Decode of B sequences of context ``ctx``, inside a CUDA graph, K/V cold (rotated over 256 MB)."""
    b = _batch((ctx,) * batch, (1,) * batch, page, cold=True)
    config = {**launch_config("decode", D), **cfg}
    ms = time_ms(lambda: paged_decode(*b.args(), ctx, **config), rep=rep)
    kv_bytes = batch * ctx * HKV * D * 2 * 2
    io_bytes = kv_bytes + batch * HQ * D * 2 * 3
    row = dict(
        op="decode",
        B=batch,
        ctx=ctx,
        fused=int(config.get("fused_reduce", False)),
        us=ms * 1e3,
        GBps=io_bytes / ms / 1e6,
        pct_hbm=100 * io_bytes / (ms * 1e-3) / HBM,
    )
    if baseline:
        row["sdpa_us"] = time_ms(_sdpa_decode(b)) * 1e3
    if reference:
        row["ref_us"] = time_ms(lambda: paged_attention_reference(*b.args()), graph=False, rep=20) * 1e3
    return row


def _sdpa_prefill(t: int, dtype=DTYPE):
    q = torch.randn(1, HQ, t, D, device=DEVICE, dtype=dtype)
    k = torch.randn(1, HKV, t, D, device=DEVICE, dtype=dtype)
    v = torch.randn_like(k)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [SDPBackend.FLASH_ATTENTION] if DEVICE == "cuda" else [SDPBackend.MATH]
    k2, v2 = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)

    def gqa():
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def expanded():
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, k2, v2, is_causal=True)

    try:
        gqa()
        return gqa
    except Exception:
        return expanded


def _causal_prefill(t: int, dtype=DTYPE):
    """``causal_attention`` (the engine's path for a lone prompt: cuDNN SDPA, then the gate) on the strided views
    the model passes: q and gate the halves of each [query | gate] head, k and v slices of one projection."""
    from hyserve.kernels.attention import causal_attention

    qg = torch.randn(t, HQ, 2 * D, device=DEVICE, dtype=dtype)
    q, gate = qg.chunk(2, dim=-1)
    k, v = torch.randn(t, 2 * HKV, D, device=DEVICE, dtype=dtype).split(HKV, dim=1)
    return lambda: causal_attention(q, k, v, D**-0.5, gate)


def bench_prefill(
    tokens: int,
    prefix: int = 0,
    page: int = 16,
    reference: bool = False,
    baseline: bool = True,
    rep: int = 20,
    **cfg,
) -> dict:
    b = _batch((prefix + tokens,), (tokens,), page)
    config = {**launch_config("prefill", D), **cfg}
    ms = time_ms(lambda: paged_prefill(*b.args(), **config), graph=False, rep=rep)
    pairs = tokens * prefix + tokens * (tokens + 1) / 2
    flops = 4 * HQ * D * pairs
    row = dict(
        op="prefill",
        T=tokens,
        prefix=prefix,
        us=ms * 1e3,
        TFLOPs=flops / ms / 1e9,
        pct_peak=100 * flops / (ms * 1e-3) / PEAK,
    )
    if prefix == 0 and baseline:
        row["sdpa_us"] = time_ms(_sdpa_prefill(tokens), graph=False) * 1e3
        with graph_backend():  # captured, warm-up included, as the prefill graphs run it: cuDNN
            row["causal_us"] = time_ms(_causal_prefill(tokens), graph=DEVICE == "cuda") * 1e3
        row["causal_eager_us"] = time_ms(_causal_prefill(tokens), graph=False) * 1e3  # eager: flash
    if reference:
        row["ref_us"] = time_ms(lambda: paged_attention_reference(*b.args()), graph=False, rep=20) * 1e3
    return row


def bench_store_kv(tokens: int, page: int = 16) -> dict:
    from hyserve.kernels.attention.triton_store_kv import store_kv_triton

    nb = math.ceil(tokens / page) + 1
    kc = torch.zeros(nb, page, HKV, D, device=DEVICE, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    k = torch.randn(tokens, HKV, D, device=DEVICE, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    slots = torch.randperm(nb * page, device=DEVICE)[:tokens]
    ms = time_ms(lambda: store_kv_triton(k, v, kc, vc, slots))
    io = 2 * 2 * tokens * HKV * D * 2
    return dict(
        op="store_kv", T=tokens, us=ms * 1e3, GBps=io / ms / 1e6, pct_hbm=100 * io / (ms * 1e-3) / HBM
    )


def run(reference: bool = True) -> list[dict]:
    rows = []
    for batch in (1, 8, 32, 64):
        for ctx in (128, 1024, 4096):
            rows.append(bench_decode(batch, ctx, reference=reference and batch * ctx <= 32 * 1024))
    rows.append(bench_decode(1, 256, reference=False))
    rows.append(bench_decode(32, 1536, reference=False))
    for tokens in (128, 1024, 4096):
        rows.append(bench_prefill(tokens, reference=reference and tokens <= 1024))
    rows.append(bench_prefill(512, prefix=3584))
    for tokens in (32, 4096):
        rows.append(bench_store_kv(tokens))
    return rows


def compare_fused(rep: int = 20) -> list[dict]:
    """Decode with the reduce launch and with the last-program merge, pair by pair (the fused row's
    ``pct_of_unfused``: its time in % of the other's), at contexts that split (ctx > SINGLE_PASS_CTX)."""
    rows = []
    for batch in (1, 8, 32, 64):
        for ctx in (512, 1024, 4096, 8192):
            pair = [
                bench_decode(batch, ctx, reference=False, baseline=False, rep=rep, fused_reduce=fused)
                for fused in (False, True)
            ]
            pair[1]["pct_of_unfused"] = 100 * pair[1]["us"] / pair[0]["us"]
            rows += pair
    return rows


def _qk_pair(batch: int, ctx: int, config: dict, rep: int) -> list[dict]:
    """One shape of ``compare_qk``: the two forms' rows."""
    from hyserve.kernels.attention.triton_decode_qk import paged_decode_qk
    from hyserve.kernels.qk_norm_rope import rope_cos_sin
    from hyserve.kernels.qk_norm_rope.triton_kernel import qk_norm_rope_store_triton

    rot = 64
    b = _batch((ctx,) * batch, (1,) * batch, 16, cold=True)
    # the projection's q (first half of each [query | gate] head), gate, k, v: strided views, as the model's
    proj = torch.randn(batch, HQ * 2 * D + 2 * HKV * D, device=DEVICE, dtype=DTYPE)
    qg, kv = proj[:, : HQ * 2 * D].view(batch, HQ, 2 * D), proj[:, HQ * 2 * D :]
    q, gate = qg[..., :D], qg[..., D:]
    k, v = kv[:, : HKV * D].view(batch, HKV, D), kv[:, HKV * D :].view(batch, HKV, D)
    qw = kw = torch.zeros(D, device=DEVICE, dtype=DTYPE)
    cos, sin = rope_cos_sin(torch.arange(ctx, device=DEVICE), rot, 1e7)
    pos = (b.seq_lens - 1).long()
    rows = torch.arange(batch, device=DEVICE)
    slots = [t[rows, pos // b.page].long() * b.page + pos % b.page for t in b.tables]
    turn = {"i": 0}

    def step(fused: bool):
        i = turn["i"] = (turn["i"] + 1) % len(b.tables)  # the next copy's cold K/V
        store = (qw, kw, 1e-6, cos, sin, pos, rot, b.k_cache, b.v_cache, slots[i])
        attend = (b.cu, b.seq_lens, b.tables[i], D**-0.5, gate, ctx)
        if fused:
            return paged_decode_qk(q, k, v, *store, *attend, **config)
        qn = qk_norm_rope_store_triton(q, k, v, *store)
        return paged_decode(qn, b.k_cache, b.v_cache, *attend, **config)

    pair = [
        dict(op="decode_qk", B=batch, ctx=ctx, fused_qk=int(f), us=time_ms(functools.partial(step, f), rep=rep) * 1e3)
        for f in (False, True)
    ]  # fmt: skip
    pair[1]["pct_of_unfused"] = 100 * pair[1]["us"] / pair[0]["us"]
    return pair


def compare_qk(rep: int = 20) -> list[dict]:
    """``decode_attention``'s two forms at the model's shapes, pair by pair in CUDA graphs over cold K/V:
    ``qk_norm_rope_store`` then the split kernel (fused_qk=0), and the split kernel with them inside (fused_qk=1:
    the decode config's ``fused_qk``); the fused row's ``pct_of_unfused``: its time in % of the other's."""
    config = launch_config("decode", D)
    return [row for batch in (1, 8, 32) for ctx in (640, 4096) for row in _qk_pair(batch, ctx, config, rep)]


DECODE_TILES = [(32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 8, 2), (128, 8, 2), (16, 4, 4)]
PREFILL_TILES = [
    (64, 64, 4, 2),
    (64, 64, 8, 2),
    (64, 32, 4, 3),
    (128, 64, 8, 2),
    (128, 32, 8, 2),
    (128, 32, 8, 3),
    (64, 64, 8, 3),
    (64, 32, 8, 3),
    (128, 64, 8, 3),
]


def _best(results: dict[str, dict[str, float]]) -> tuple[str, dict[str, float]]:
    """Config with the smallest geometric-mean time relative to each case's best."""
    cases = next(iter(results.values())).keys()
    best_per_case = {c: min(r[c] for r in results.values()) for c in cases}
    score = {
        name: math.exp(sum(math.log(r[c] / best_per_case[c]) for c in cases) / len(cases))
        for name, r in results.items()
    }
    name = min(score, key=score.get)
    return name, score


def sweep(log=print, decode: bool = True) -> dict:
    """Time the tile configs on a few decode and prefill shapes; returns the best of each (``decode=False``:
    the prefill's only)."""
    best = {"prefill": sweep_prefill(log)}
    if decode:
        best["decode"] = sweep_decode(log)
    log('best configs for configs/attention.json (key "256"): ' + json.dumps(best))
    return best


def sweep_decode(log=print) -> dict:
    """The decode tile config of the fewest total microseconds over a few (batch, context) shapes."""
    decode_cases = [(1, 4096), (8, 1024), (32, 1536), (32, 4096), (64, 1024)]
    results: dict[str, dict[str, float]] = {}
    configs: dict[str, dict] = {}
    for bn, nw, ns in DECODE_TILES:
        for waves in (2.0, 4.0, 8.0):
            cfg = dict(block_n=bn, num_warps=nw, num_stages=ns, waves=waves)
            name = json.dumps(cfg)
            try:
                results[name] = {
                    f"{b}x{c}": bench_decode(b, c, reference=False, baseline=False, rep=10, **cfg)["us"]
                    for b, c in decode_cases
                }
                configs[name] = cfg
            except Exception as e:  # out of shared memory / registers
                log(f"decode {cfg}: {type(e).__name__}")
    name, score = _best(results)
    for n in sorted(results, key=score.get)[:5]:
        log(f"decode {n}: {' '.join(f'{k}={v:.1f}us' for k, v in results[n].items())} (x{score[n]:.3f})")
    best = configs[name]
    # short contexts: is one pass (no reduce kernel) really faster than a few partitions?
    for b, c in ((1, 256), (1, 512), (8, 256), (32, 256)):
        times = {
            s: bench_decode(b, c, reference=False, baseline=False, rep=10, num_splits=s, **best)["us"]
            for s in (1, 2, 4, 8)
        }
        log(f"decode B={b} ctx={c} by num_splits: " + " ".join(f"{s}:{t:.1f}us" for s, t in times.items()))
    return best


def sweep_prefill(log=print) -> dict:
    """The prefill tile config of the fewest total microseconds over fresh and prefixed prompts."""
    prefill_cases = [(1024, 0), (4096, 0), (512, 3584)]
    results, configs = {}, {}
    for bm, bn, nw, ns in PREFILL_TILES:
        cfg = dict(block_m=bm, block_n=bn, num_warps=nw, num_stages=ns)
        name = json.dumps(cfg)
        try:
            results[name] = {
                f"{t}+{p}": bench_prefill(t, p, baseline=False, rep=10, **cfg)["us"] for t, p in prefill_cases
            }
            configs[name] = cfg
        except Exception as e:
            log(f"prefill {cfg}: {type(e).__name__}")
    name, score = _best(results)
    for n in sorted(results, key=score.get)[:4]:
        log(f"prefill {n}: {' '.join(f'{k}={v:.1f}us' for k, v in results[n].items())} (x{score[n]:.3f})")
    return configs[name]


def format_rows(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        cells = [f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true", help="try tile configs and print the best")
    parser.add_argument("--sweep-prefill", action="store_true", help="--sweep, the prefill tiles only")
    parser.add_argument("--fused", action="store_true", help="only the decode's fused_reduce A/B")
    parser.add_argument("--qk", action="store_true", help="only decode_attention's fused_qk A/B")
    parser.add_argument("--no-reference", action="store_true")
    args = parser.parse_args()
    if args.fused:
        print(format_rows(compare_fused()))
        return
    if args.qk:
        print(format_rows(compare_qk()))
        return
    if args.sweep or args.sweep_prefill:
        sweep(decode=not args.sweep_prefill)
    print(format_rows(run(reference=not args.no_reference)))


if __name__ == "__main__":
    main()
