"""Micro-benchmark of the screened greedy head at the LM head's shape (bf16 [248320, 2048], N rows of x).

``python -m hyserve.kernels.greedy_head.bench [--rows 1,2,4] [--sweep]``: time (CUDA-graph replay, median),
the bytes the screen reads (the int8 head, scales, radii), GB/s and % of 4.0 TB/s, the rows computed exactly
(mean over fresh x), and beside it the full head as the decode step runs it (``linear`` then
``logits_argmax``). Every timed x's token is checked against the full head's first. The head is N(0, 1/K) and
x N(0, 1), as the dummy model's LM head and final norm give, so the candidate count is the dummy model's too.
``--sweep`` times every screen plan of ``PLANS``.
"""

from __future__ import annotations

import argparse

import torch

from hyserve.kernels.argmax import logits_argmax
from hyserve.kernels.greedy_head.reference import build_greedy_screen
from hyserve.kernels.greedy_head.triton_kernel import SCREEN_PLAN, screened_greedy_triton
from hyserve.kernels.linear import linear
from hyserve.kernels.rmsnorm.bench import DEVICE, DTYPE, HBM, Cycle, time_ms

PLANS = [
    (16, 256, 4, 0),
    (32, 256, 4, 0),
    (64, 128, 4, 0),
    (32, 128, 4, 0),
    (64, 128, 4, 3),
    (64, 128, 4, 4),
    (32, 256, 4, 4),
    (128, 128, 8, 4),
    (64, 256, 4, 3),
    (128, 64, 4, 4),
]


def _full(x, weight):
    return logits_argmax(linear(x, weight))[1]


def bench(rows: int, plans: list, vocab: int = 248320, hidden: int = 2048, draws: int = 16) -> list[dict]:
    gen = torch.Generator(device=DEVICE).manual_seed(rows)
    weight = (torch.randn(vocab, hidden, device=DEVICE, generator=gen) / hidden**0.5).to(DTYPE)
    screen = build_greedy_screen(weight)
    xs = [torch.randn(rows, hidden, device=DEVICE, generator=gen).to(DTYPE) for _ in range(draws)]
    count = torch.zeros(rows, dtype=torch.int64, device=DEVICE)
    for x in xs:
        got = screened_greedy_triton(x, weight, screen, count=count)
        if got.tolist() != _full(x, weight).tolist():
            raise SystemExit(f"screened token differs from the full head's at rows={rows}")
    exact_rows = count.float().mean().item() / draws
    full_us = time_ms(Cycle(_full, [(x, weight) for x in xs])) * 1e3
    io = screen.nbytes + rows * vocab * 8 + exact_rows * rows * hidden * 2
    out = []
    for plan in plans:
        ms = time_ms(
            Cycle(
                lambda x, p=plan: screened_greedy_triton(x, weight, screen, screen_plan=p), [(x,) for x in xs]
            )
        )
        out.append(dict(op="screened_greedy", N=rows, plan=plan, us=ms * 1e3, GBps=io / ms / 1e6,
                        pct_hbm=100 * io / (ms * 1e-3) / HBM, exact_rows=exact_rows, full_us=full_us))  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,2,4")
    p.add_argument("--sweep", action="store_true")
    a = p.parse_args()
    for rows in (int(r) for r in a.rows.split(",")):
        plans = PLANS if a.sweep else [SCREEN_PLAN[min(p for p in SCREEN_PLAN if p >= rows)]]
        for r in bench(rows, plans):
            print(
                "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()),
                flush=True,
            )


if __name__ == "__main__":
    main()
