"""Probe: Triton's automatic warp specialisation on the DeltaNet prefill's state pass.

``python scripts/probe_gdn_ws.py [--lens 1024,4096]`` (GPU; ``TRITON_INTERPRET=1`` checks the values on the CPU).

The state pass's output dots are half its time though nothing depends on them (docs/performance.md,
2026-12-06): they queue on the one warpgroup that also runs the recurrence. This writes a copy of
``kernels/gated_delta_rule/triton_prefill.py`` whose chunk loop is ``tl.range(..., warp_specialize=True)``
(the compiler may then split loads and dots over warp groups), checks its output against the production
kernel and times the whole wrapper graph-replayed at 4 and 8 warps against the plan.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

import hyserve.kernels.gated_delta_rule.triton_prefill as tp

GPU = torch.cuda.is_available()
LOOP = "    for c in range(n_chunks):\n        t0 = start + c * 64\n        rows = (t0 + rr).to(tl.int64)\n        mr = rows < end\n        w = tl.load("


def variant_module():
    src = Path(tp.__file__).read_text()
    head, sep, tail = src.partition("def _state_output_kernel(")
    if not sep or tail.count(LOOP) != 1:
        raise SystemExit("the production file changed: update the probe's edit")
    tail = tail.replace(
        LOOP, LOOP.replace("range(n_chunks)", "tl.range(0, n_chunks, warp_specialize=True)"), 1
    )
    path = Path("/tmp/gdn_prefill_ws.py")
    path.write_text(head + sep + tail)
    spec = importlib.util.spec_from_file_location("gdn_prefill_ws", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gdn_prefill_ws"] = mod
    spec.loader.exec_module(mod)
    return mod


def run(t: int, mod) -> None:
    dev = "cuda" if GPU else "cpu"
    dt = torch.bfloat16 if GPU else torch.float32
    h, hv, kd = (16, 32, 128) if GPU else (2, 4, 32)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(t, 2 * h * kd + hv * kd, device=dev, dtype=dt, generator=gen)
    q, k = x[:, : h * kd].view(t, h, kd), x[:, h * kd : 2 * h * kd].view(t, h, kd)
    v = x[:, 2 * h * kd :].view(t, hv, kd)
    g = -torch.rand(t, hv, device=dev, generator=gen) * 0.5
    beta = torch.rand(t, hv, device=dev, generator=gen).to(dt)
    state0 = torch.randn(1, hv, kd, kd, device=dev, generator=gen) * 0.1
    cu = torch.tensor([0, t], device=dev, dtype=torch.int32)
    idx = torch.zeros(1, dtype=torch.long, device=dev)
    init = torch.ones(1, dtype=torch.bool, device=dev)
    s_ref = state0.clone()
    o_ref = tp.gated_delta_rule_prefill_triton(q, k, v, g, beta, s_ref, cu, idx, init)
    rows = []
    for warps in (4, 8):
        cfg = {"state_output": {**tp._CONFIGS["state_output"], "num_warps": warps}}
        s = state0.clone()
        try:
            o = mod.gated_delta_rule_prefill_triton(q, k, v, g, beta, s, cu, idx, init, configs=cfg)
        except Exception as e:  # noqa: BLE001 - report the compiler's refusal and go on
            rows.append(f"warp_specialize, {warps} warps: failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        diff = ((o.float() - o_ref.float()).abs().max().item(), (s - s_ref).abs().max().item())
        line = f"warp_specialize, {warps} warps: max |o - plan| {diff[0]:.2e}, |state - plan| {diff[1]:.2e}"
        if GPU:
            import triton.testing as tt

            def timed(m, c, s=s) -> float:
                fn = lambda: m.gated_delta_rule_prefill_triton(q, k, v, g, beta, s, cu, idx, init, configs=c)  # noqa: E731
                return 1e3 * tt.do_bench_cudagraph(fn, rep=50, return_mode="median")

            line += f"; wrapper {timed(mod, cfg):.1f} us against the plan's {timed(tp, {}):.1f}"
        rows.append(line)
    for line in rows:
        print(f"T={t}: {line}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lens", default="1024,4096" if GPU else "128")
    args = parser.parse_args()
    mod = variant_module()
    for t in (int(x) for x in args.lens.split(",")):
        run(t, mod)


if __name__ == "__main__":
    main()
