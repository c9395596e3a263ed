"""Probe: could the DeltaNet prefill's chunk solve and its serial state pass overlap on one GPU?

``python scripts/probe_gdn_overlap.py [--lens 1024,4096]`` (GPU only).

The state pass of chunk c needs only chunk c's solve, so a producer/consumer build (per-chunk flags) could run
the two together. Before building one, this times the two production kernels graph-replayed one after the
other against the same two launched on two streams of one graph with no dependency between them (the state pass
reads an earlier solve's buffers, so the values are not the prefill's): if the concurrent time is near the
larger of the two, SMs can host both and the build is worth it; near their sum, it is not.
"""

from __future__ import annotations

import argparse

import torch
import triton.testing as tt

import hyserve.kernels.gated_delta_rule.triton_prefill as tp


def buffers(t: int, hv: int, kd: int, dt, dev):
    return dict(
        cum=torch.empty(t, hv, device=dev),
        rk=torch.empty(t, hv, device=dev),
        qs=torch.empty(t, hv, device=dev),
        w=torch.empty(t, hv, kd, device=dev, dtype=dt),
        u=torch.empty(t, hv, kd, device=dev, dtype=dt),
        aqk=torch.empty(t, hv, 64, device=dev, dtype=dt),
    )


def run(t: int) -> None:
    dev, dt = "cuda", torch.bfloat16
    h, hv, kd = 16, 32, 128
    meta = dict(HV=hv, G=hv // h, K=kd, V=kd, BK=kd, DT=tp._TL_DTYPES[dt], PREC="tf32")
    cfg = tp._CONFIGS
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(t, 2 * h * kd + hv * kd, device=dev, dtype=dt, generator=gen)
    q, k = x[:, : h * kd].view(t, h, kd), x[:, h * kd : 2 * h * kd].view(t, h, kd)
    v = x[:, 2 * h * kd :].view(t, hv, kd)
    g = -torch.rand(t, hv, device=dev, generator=gen) * 0.5
    beta = torch.rand(t, hv, device=dev, generator=gen).to(dt)
    state = torch.randn(1, hv, kd, kd, device=dev, generator=gen) * 0.1
    cu = torch.tensor([0, t], device=dev, dtype=torch.int32)
    idx = torch.zeros(1, dtype=torch.long, device=dev)
    init = torch.ones(1, dtype=torch.int8, device=dev)
    out = torch.empty(t, hv, kd, device=dev, dtype=dt)
    a, b = buffers(t, hv, kd, dt, dev), buffers(t, hv, kd, dt, dev)

    def solve(buf) -> None:
        tp._prepare_kernel[(t // 64 + 1, hv)](
            q, k, v, g, beta, cu, buf["w"], buf["u"], buf["cum"], buf["rk"], buf["aqk"], buf["qs"],
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0),
            beta.stride(0), 1, kd**-0.5, **meta, BV=kd, BN=64, FUSED=True,
            num_warps=cfg["prepare"]["num_warps"],
        )  # fmt: skip

    def state_pass(buf) -> None:
        so = cfg["state_output"]
        tp._state_output_kernel[(1, hv, kd // so["BV"])](
            q, k, buf["w"], buf["u"], buf["cum"], buf["rk"], buf["aqk"], buf["qs"], cu, state, idx, init, out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), out.stride(0), out.stride(1), 1, **meta,
            BV=so["BV"], num_warps=so["num_warps"], num_stages=so["num_stages"],
        )  # fmt: skip

    solve(b)
    side = torch.cuda.Stream()

    def overlapped(solve_first: bool) -> None:
        # fork: the side stream waits for the main stream's work so far, then both run with no edge between
        side.wait_stream(torch.cuda.current_stream())
        first, second = (solve, state_pass) if solve_first else (state_pass, solve)
        first(a if first is solve else b)
        with torch.cuda.stream(side):
            second(a if second is solve else b)
        torch.cuda.current_stream().wait_stream(side)

    def timed(fn) -> float:
        return 1e3 * tt.do_bench_cudagraph(fn, rep=50, return_mode="median")

    s_us = timed(lambda: solve(a))
    p_us = timed(lambda: state_pass(b))
    seq_us = timed(lambda: (solve(a), state_pass(b)))
    o1 = timed(lambda: overlapped(True))
    o2 = timed(lambda: overlapped(False))
    print(
        f"T={t}: solve {s_us:.1f} us, state pass {p_us:.1f}, one after the other {seq_us:.1f}, "
        f"on two streams {o1:.1f} (solve launched first) / {o2:.1f} (state pass first)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lens", default="1024,4096")
    args = parser.parse_args()
    for t in (int(x) for x in args.lens.split(",")):
        run(t)


if __name__ == "__main__":
    main()
