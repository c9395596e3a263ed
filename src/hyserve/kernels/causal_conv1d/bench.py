"""Micro-benchmark of the varlen causal conv1d prefill at the model's shape (D=8192, W=4, bf16).

``python -m hyserve.kernels.causal_conv1d.bench [--sweep]``: eager timing (as the engine runs prefill,
L2 flushed between calls), bytes = x read + out write (+ states), GB/s and % of 4.0 TB/s, beside the
torch reference. ``--sweep`` times BT x BD x warps and prints the best.
"""

from __future__ import annotations

import argparse

import torch

from hyserve.kernels.causal_conv1d.reference import causal_conv1d_prefill_reference
from hyserve.kernels.causal_conv1d.triton_kernel import causal_conv1d_prefill_triton
from hyserve.kernels.gated_delta_rule.bench import DEVICE, DTYPE, HBM, fmt, time_ms

D, W = 8192, 4


def inputs(lens: list[int], seed: int = 0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    n = len(lens)
    # the model passes a strided view of the fused in_proj output (row stride D + 4096 + 64)
    proj = torch.randn(sum(lens), D + 4096 + 64, device=DEVICE, generator=gen).to(DTYPE)
    x = proj[:, :D]
    weight = (torch.randn(D, W, device=DEVICE, generator=gen) * 0.5).to(DTYPE)
    state = torch.randn(n, W - 1, D, device=DEVICE, generator=gen).to(DTYPE)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=DEVICE, dtype=torch.int32)
    idx = torch.arange(n, device=DEVICE)
    init = torch.ones(n, dtype=torch.bool, device=DEVICE)
    return x, weight, state, cu, idx, init


def bench(lens: list[int], block_t=None, block_d=None, num_warps=None, baselines: bool = True) -> dict:
    args = inputs(lens)
    io = 2 * sum(lens) * D * 2 + 2 * len(lens) * (W - 1) * D * 2
    fn = lambda: causal_conv1d_prefill_triton(*args, block_t=block_t, block_d=block_d, num_warps=num_warps)  # noqa: E731
    ms = time_ms(fn, graph=False)
    name = f"{len(lens)}x{lens[0]}" if len(set(lens)) == 1 else str(lens)
    row = dict(op="conv_prefill", lens=name, cfg=f"{block_t or 'cfg'}/{block_d or 'cfg'}/{num_warps or 'cfg'}",
               us=ms * 1e3, GBps=io / ms / 1e6, pct_hbm=100 * io / (ms * 1e-3) / HBM)  # fmt: skip
    if baselines:
        row["ref_us"] = time_ms(lambda: causal_conv1d_prefill_reference(*args), graph=False) * 1e3
    return row


LENS = ([128], [1024], [4096], [16384], [512] * 8)


def sweep() -> list[dict]:
    rows = []
    for lens in ([1024], [16384]):
        cands = [bench(lens, bt, bd, w, baselines=False) for bt, bd, w in
                 ((32, 128, 4), (16, 256, 4), (64, 128, 8), (32, 256, 8), (16, 128, 4))]  # fmt: skip
        rows += cands
        top = min(cands, key=lambda r: r["us"])
        print(f"best conv_prefill {lens}: BT/BD/warps={top['cfg']} {top['us']:.1f} us")
    return rows


def run(do_sweep: bool = False) -> list[dict]:
    if DEVICE != "cuda":
        return [bench([5, 3], baselines=False)]
    rows = [bench(lens) for lens in LENS]
    return rows + (sweep() if do_sweep else [])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true")
    print(fmt(run(parser.parse_args().sweep)))


if __name__ == "__main__":
    main()
