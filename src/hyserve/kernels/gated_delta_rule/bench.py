"""Micro-benchmark of the gated delta rule at the model's shapes (H=16, HV=32, K=V=128, bf16).

``python -m hyserve.kernels.gated_delta_rule.bench [--sweep]``

* decode, B in 1/8/32/64: CUDA-graph replay (as the engine runs decode), states rotated over a pool much
  larger than the L2; bytes = state read + write (+ q/k/v/o), GB/s and % of 4.0 TB/s; beside it the
  torch reference and fla's ``fused_recurrent_gated_delta_rule`` when fla is importable.
* prefill, one sequence of 128/1024/4096 tokens and 8 x 512: eager (as the engine runs a mixed step's prefill),
  nominal chunked-form FLOPs -> TFLOP/s (of 728), and ``graph_us`` graph-replayed (as it runs a lone prompt's);
  beside it fla's ``chunk_gated_delta_rule`` when importable.

``--sweep`` also times the tile configs (decode BV x warps; prefill state/output BV, the solve's warps) and
prints the best (prefill: by ``graph_us``).
The helpers here (``time_ms``, ``fla_*``) are shared by the other GDN benches and ``gpu_check``.
"""

from __future__ import annotations

import argparse
import time

import torch

from hyserve.kernels.gated_delta_rule.reference import (
    gated_delta_rule_decode_reference,
    gated_delta_rule_prefill_reference,
)
from hyserve.kernels.gated_delta_rule.triton_decode import gated_delta_rule_decode_triton
from hyserve.kernels.gated_delta_rule.triton_prefill import gated_delta_rule_prefill_triton

HBM = 4.0e12
PEAK = 728e12
H, HV, K, V = 16, 32, 128, 128
D = 2 * H * K + HV * V
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU (interpreter) only smoke-tests this file
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16
COLD_BYTES = 512 << 20  # rotate state slots over this much so back-to-back calls miss the 50 MB L2


def time_ms(fn, graph: bool = True, rep: int = 30) -> float:
    """Median ms of ``fn``: CUDA-graph replay (no launch overhead) or eager (with it); CPU: one wall call."""
    if DEVICE != "cuda":
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing as tt

    fn()  # warm-up / compile outside the capture (workspaces are allocated on first use)
    torch.cuda.synchronize()
    if graph:
        try:
            return tt.do_bench_cudagraph(fn, rep=rep, return_mode="median")
        except Exception as e:  # noqa: BLE001 - report and fall back to eager timing
            print(f"  (graph capture failed: {type(e).__name__}: {e}; eager timing)")
            torch.cuda.synchronize()
    return tt.do_bench(fn, warmup=5, rep=rep, return_mode="median")


class Cycle:
    """Calls ``fn(*args_i)`` with i cycling over argument sets (cold states for back-to-back calls)."""

    def __init__(self, fn, arg_sets: list[tuple], **kwargs) -> None:
        self.fn, self.arg_sets, self.kwargs, self.i = fn, arg_sets, kwargs, 0

    def __call__(self):
        self.i = (self.i + 1) % len(self.arg_sets)
        return self.fn(*self.arg_sets[self.i], **self.kwargs)


def fmt(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [
        [f"{r[k]:.1f}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys] for r in rows
    ]
    width = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, width))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(cell, width)) for cell in cells]
    return "\n".join(lines)


# ---------------------------------------------------------------- optional fla baselines


def _fla(name: str):
    try:
        import fla.ops.gated_delta_rule as m

        return getattr(m, name)
    except Exception:  # noqa: BLE001 - fla is optional
        return None


def fla_chunk(q, k, v, g, beta, initial, cu_seqlens):
    """fla's chunk_gated_delta_rule on our packed layout (GVA native, else q/k heads repeated). None: no fla."""
    fn = _fla("chunk_gated_delta_rule")
    if fn is None:
        return None
    q4, k4, v4, g3, b3 = (t.unsqueeze(0).contiguous() for t in (q, k, v, g, beta))
    cu = cu_seqlens.long()

    def call(qq, kk):
        return fn(qq, kk, v4, g3, b3, scale=K**-0.5, initial_state=initial, output_final_state=True,
                  cu_seqlens=cu, use_qk_l2norm_in_kernel=True)  # fmt: skip

    try:
        call(q4, k4)
        return lambda: call(q4, k4)
    except Exception:  # noqa: BLE001 - older fla: no GVA
        group = v.shape[1] // q.shape[1]
        q5, k5 = q4.repeat_interleave(group, dim=2), k4.repeat_interleave(group, dim=2)
        try:
            call(q5, k5)
            return lambda: call(q5, k5)
        except Exception as e:  # noqa: BLE001
            print(f"  (fla chunk_gated_delta_rule failed: {type(e).__name__}: {e})")
            return None


def fla_recurrent(q, k, v, g, beta, initial):
    """fla's fused_recurrent_gated_delta_rule, one token per sequence (states gathered beforehand)."""
    fn = _fla("fused_recurrent_gated_delta_rule")
    if fn is None:
        return None
    q4, k4, v4, g3, b3 = (t.unsqueeze(1).contiguous() for t in (q, k, v, g, beta))

    def call(qq, kk):
        return fn(qq, kk, v4, g3, b3, scale=K**-0.5, initial_state=initial, output_final_state=True,
                  use_qk_l2norm_in_kernel=True)  # fmt: skip

    for qq, kk in ((q4, k4), (q4.repeat_interleave(HV // H, 2), k4.repeat_interleave(HV // H, 2))):
        try:
            call(qq, kk)
            return lambda qq=qq, kk=kk: call(qq, kk)
        except Exception as e:  # noqa: BLE001
            err = e
    print(f"  (fla fused_recurrent failed: {type(err).__name__}: {err})")
    return None


# ---------------------------------------------------------------- inputs


def decode_inputs(batch: int, copies: int, seed: int = 0):
    """``copies`` argument sets over disjoint state slots of one pool (q/k/v: views of [B, D])."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    state = torch.randn(batch * copies, HV, K, V, device=DEVICE, generator=gen) * 0.1
    sets = []
    for c in range(copies):
        x = torch.randn(batch, D, device=DEVICE, dtype=DTYPE, generator=gen)
        q = x[:, : H * K].view(batch, H, K)
        k = x[:, H * K : 2 * H * K].view(batch, H, K)
        v = x[:, 2 * H * K :].view(batch, HV, V)
        g = -torch.rand(batch, HV, device=DEVICE, generator=gen)
        beta = torch.rand(batch, HV, device=DEVICE, generator=gen).to(DTYPE)
        idx = torch.arange(c * batch, (c + 1) * batch, device=DEVICE)
        sets.append((q, k, v, g, beta, state, idx))
    return sets


def prefill_inputs(lens: list[int], seed: int = 0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    t = sum(lens)
    x = torch.randn(t, D, device=DEVICE, dtype=DTYPE, generator=gen)
    q = x[:, : H * K].view(t, H, K)
    k = x[:, H * K : 2 * H * K].view(t, H, K)
    v = x[:, 2 * H * K :].view(t, HV, V)
    g = -torch.rand(t, HV, device=DEVICE, generator=gen) * 0.5
    beta = torch.rand(t, HV, device=DEVICE, generator=gen).to(DTYPE)
    n = len(lens)
    state = torch.randn(n, HV, K, V, device=DEVICE, generator=gen) * 0.1
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=DEVICE, dtype=torch.int32)
    idx = torch.arange(n, device=DEVICE)
    init = torch.ones(n, dtype=torch.bool, device=DEVICE)
    return q, k, v, g, beta, state, cu, idx, init


def prefill_flops(lens: list[int]) -> float:
    """Nominal FLOPs of the chunked form: per 64-token chunk and head, 5 [64x64x128] + 4 [64^3] (inverse)
    + 3 [64x128x128] matmuls, 2 FLOP per multiply-add."""
    chunks = sum(-(-n // 64) for n in lens)
    per = 5 * 2 * 64 * 64 * K + 4 * 2 * 64**3 + 3 * 2 * 64 * K * V
    return chunks * HV * per


# ---------------------------------------------------------------- benches


def bench_decode(
    batch: int, block_v: int | None = None, num_warps: int | None = None, baselines=True
) -> dict:
    state_bytes = batch * HV * K * V * 4
    io = 2 * state_bytes + batch * (D + HV * V) * 2
    copies = max(1, min(64, COLD_BYTES // state_bytes)) if DEVICE == "cuda" else 1
    sets = decode_inputs(batch, copies)
    ms = time_ms(Cycle(gated_delta_rule_decode_triton, sets, block_v=block_v, num_warps=num_warps))
    row = dict(op="decode", B=batch, BV=block_v or "cfg", warps=num_warps or "cfg", us=ms * 1e3,
               GBps=io / ms / 1e6, pct_hbm=100 * io / (ms * 1e-3) / HBM)  # fmt: skip
    if baselines:
        row["ref_us"] = time_ms(Cycle(gated_delta_rule_decode_reference, sets)) * 1e3
        q, k, v, g, beta, state, idx = sets[0]
        fla = fla_recurrent(q, k, v, g, beta, state[idx].contiguous()) if DEVICE == "cuda" else None
        row["fla_us"] = time_ms(fla) * 1e3 if fla else "-"
    return row


def bench_prefill(lens: list[int], configs: dict | None = None, baselines=True) -> dict:
    args = prefill_inputs(lens)
    q, k, v, g, beta, state, cu, idx, init = args
    fn = lambda: gated_delta_rule_prefill_triton(*args, configs=configs)  # noqa: E731
    ms = time_ms(fn, graph=False)
    flops = prefill_flops(lens)
    row = dict(op="prefill", lens=f"{len(lens)}x{lens[0]}" if len(set(lens)) == 1 else str(lens),
               cfg=str(configs or "cfg"), us=ms * 1e3, TFLOPs=flops / ms / 1e9, pct_peak=100 * flops / (ms * 1e-3) / PEAK)  # fmt: skip
    if DEVICE == "cuda":
        # a lone prompt's prefill replays a CUDA graph (engine/prefill_graphs.py): the kernels without the launches,
        # the number the plan is picked by (eager timing favours fewer launches: docs/performance.md, 2026-12-06)
        row["graph_us"] = time_ms(fn) * 1e3
    if baselines:
        fla = fla_chunk(q, k, v, g, beta, state.clone(), cu) if DEVICE == "cuda" else None
        row["fla_us"] = time_ms(fla, graph=False) * 1e3 if fla else "-"
        if sum(lens) <= 1024:
            ref = lambda: gated_delta_rule_prefill_reference(*args)  # noqa: E731
            row["ref_us"] = time_ms(ref, graph=False) * 1e3
    return row


DECODE_BATCHES = (1, 8, 32, 64)
# fused = output inside the state loop (2 launches); unfused = state kernel + parallel output kernel (3)
PREFILL_SWEEP = [
    {"fused_output": True, "state_output": {"BV": bv, "num_warps": 4, "num_stages": ns}}
    for bv, ns in ((16, 2), (32, 2), (32, 3), (64, 2))
] + [
    {
        "fused_output": False,
        "state": {"BV": sbv, "num_warps": 4, "num_stages": 2},
        "output": {"BV": obv, "num_warps": 4},
    }
    for sbv in (32, 64)
    for obv in (64, 128)
]
PREFILL_SWEEP += [{"prepare": {"num_warps": w}} for w in (2, 4, 16)]  # the chunk solve (default 8 warps)
PREFILL_LENS = ([128], [1024], [4096], [512] * 8)


def run(sweep: bool = False) -> list[dict]:
    if DEVICE != "cuda":  # interpreter smoke test: tiny and few
        return [bench_decode(1, baselines=False)]
    rows = [bench_decode(b) for b in DECODE_BATCHES]
    rows += [bench_prefill(lens) for lens in PREFILL_LENS]
    if sweep:
        rows += sweep_rows()
    return rows


def sweep_rows() -> list[dict]:
    rows = []
    for b in DECODE_BATCHES:
        cands = [bench_decode(b, bv, w, baselines=False) for bv in (32, 64, 128) for w in (4, 8)]
        rows += cands
        best = min(cands, key=lambda r: r["us"])
        print(f"best decode B={b}: BV={best['BV']} warps={best['warps']} {best['us']:.1f} us")
    for lens in ([1024], [4096]):
        cands = [bench_prefill(lens, cfg, baselines=False) for cfg in PREFILL_SWEEP]
        rows += cands
        best = min(cands, key=lambda r: r["graph_us"])
        print(f"best prefill {lens} (graph-replayed): {best['cfg']} {best['graph_us']:.1f} us")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true")
    rows = run(parser.parse_args().sweep)
    print(fmt(rows))


if __name__ == "__main__":
    main()
