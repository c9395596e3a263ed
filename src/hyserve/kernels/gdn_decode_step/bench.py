"""Micro-benchmark of the fused DeltaNet decode step at the model's shapes (H=16, HV=32, K=V=128, bf16).

``python -m hyserve.kernels.gdn_decode_step.bench [--sweep]``: CUDA-graph replay (as the engine runs
decode), state slots rotated over a pool much larger than the L2. Bytes = ssm state read + write, conv
state read + write, mixed_qkv, z, o; GB/s and % of 4.0 TB/s. Beside it: the unfused composition with
the Triton recurrent kernel (conv and norm through their ops) and the pure reference. ``--sweep`` times
BV x warps per batch size and prints the best (the table for ``_CONFIGS`` in triton_kernel.py).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from hyserve.kernels.causal_conv1d import causal_conv1d_decode
from hyserve.kernels.gated_delta_rule.bench import COLD_BYTES, DEVICE, DTYPE, HBM, Cycle, fmt, time_ms
from hyserve.kernels.gated_delta_rule.triton_decode import gated_delta_rule_decode_triton
from hyserve.kernels.gated_rmsnorm import gated_rms_norm
from hyserve.kernels.gdn_decode_step.reference import gdn_decode_step_reference
from hyserve.kernels.gdn_decode_step.triton_kernel import gdn_decode_step_triton

H, HV, K, V, W = 16, 32, 128, 128, 4
D = 2 * H * K + HV * V


def step_inputs(batch: int, copies: int, seed: int = 0) -> list[tuple]:
    """Argument sets over disjoint slots; mixed_qkv/z/b/a are views of one fused in_proj output."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    slots = batch * copies
    conv_w = (torch.randn(D, W, device=DEVICE, generator=gen) * 0.5).to(DTYPE)
    a_log = torch.rand(HV, device=DEVICE, generator=gen).add(1).log().to(DTYPE)
    dt_bias = torch.rand(HV, device=DEVICE, generator=gen).to(DTYPE)
    norm_w = torch.ones(V, device=DEVICE, dtype=DTYPE)
    conv_state = torch.randn(slots, W - 1, D, device=DEVICE, generator=gen).to(DTYPE)
    ssm_state = torch.randn(slots, HV, K, V, device=DEVICE, generator=gen) * 0.1
    sets = []
    for c in range(copies):
        proj = torch.randn(batch, D + HV * V + 2 * HV, device=DEVICE, generator=gen).to(DTYPE)
        x, z, b, a = proj.split([D, HV * V, HV, HV], dim=-1)
        idx = torch.arange(c * batch, (c + 1) * batch, device=DEVICE)
        sets.append(
            (x, z.view(batch, HV, V), a, b, conv_w, a_log, dt_bias, norm_w, 1e-6, conv_state, ssm_state, idx)
        )
    return sets


def unfused(x, z, a, b, conv_w, a_log, dt_bias, norm_w, eps, conv_state, ssm_state, idx):
    """The model's former decode path with today's ops: conv op, torch gates, Triton recurrence, norm op."""
    y = causal_conv1d_decode(x, conv_w, conv_state, idx)
    q, k, v = y.split([H * K, H * K, HV * V], dim=-1)
    batch = x.shape[0]
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    o = gated_delta_rule_decode_triton(
        q.view(batch, H, K), k.view(batch, H, K), v.view(batch, HV, V), g, b.sigmoid(), ssm_state, idx
    )
    return gated_rms_norm(o, z, norm_w, eps)


def step_bytes(batch: int) -> int:
    return batch * (2 * HV * K * V * 4 + 2 * (W - 1) * D * 2 + D * 2 + 2 * HV * V * 2) + D * W * 2


def bench(
    batch: int, block_v: int | None = None, num_warps: int | None = None, baselines: bool = True
) -> dict:
    io = step_bytes(batch)
    copies = max(1, min(64, COLD_BYTES // io)) if DEVICE == "cuda" else 1
    sets = step_inputs(batch, copies)
    ms = time_ms(Cycle(gdn_decode_step_triton, sets, block_v=block_v, num_warps=num_warps))
    row = dict(op="gdn_decode_step", B=batch, BV=block_v or "cfg", warps=num_warps or "cfg", us=ms * 1e3,
               GBps=io / ms / 1e6, pct_hbm=100 * io / (ms * 1e-3) / HBM)  # fmt: skip
    if baselines:
        row["unfused_us"] = time_ms(Cycle(unfused, sets)) * 1e3
        row["ref_us"] = time_ms(Cycle(gdn_decode_step_reference, sets)) * 1e3
    return row


BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


def sweep(batches=BATCHES) -> list[dict]:
    rows, best = [], []
    for b in batches:
        grid = [(bv, w) for bv in (32, 64, 128) for w in (4, 8)]
        # one- and two-warp programs: every reduction stays inside a warp (BV=16 on one warp: 6 CTA barriers in
        # the sm_90 build against 24 for the B <= 2 config; 215 registers, no spill)
        grid += [(16, 1), (16, 2), (32, 2)]
        cands = [bench(b, bv, w, baselines=False) for bv, w in grid]
        rows += cands
        top = min(cands, key=lambda r: r["us"])
        best.append((b, top["BV"], top["warps"]))
        print(f"best gdn_decode_step B={b}: BV={top['BV']} warps={top['warps']} {top['us']:.1f} us")
    print("suggested _CONFIGS (batch bound, BV, warps):", best)
    return rows


def run(do_sweep: bool = False) -> list[dict]:
    if DEVICE != "cuda":  # interpreter smoke test
        return [bench(1, baselines=False)]
    rows = [bench(b) for b in BATCHES]
    if do_sweep:
        rows += sweep()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true")
    print(fmt(run(parser.parse_args().sweep)))


if __name__ == "__main__":
    main()
