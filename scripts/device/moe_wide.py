"""The grouped MoE kernels at one prompt length, one tile plan a line: the committed plan against wider and
narrower ones (BLOCK_I 256, BLOCK_K 32, 5 stages, block_m 32), each timed alone as ``moe.tune`` does (CUDA
graph, L2 flushed), with the weight bytes its experts read per microsecond. Asks whether any plan reaches at
1024 tokens the rate the 128-token plan streams at.

usage: python3 scripts/device/moe_wide.py [--tokens 128,1024] [--committed]
"""

from __future__ import annotations

import argparse

import torch

from hyserve.kernels.moe import tune as t
from hyserve.kernels.moe.bench import moved_bytes
from hyserve.kernels.moe.configs import get_plan


def _gu(bi: int, bk: int, w: int, s: int, tma: int = 1) -> dict:
    return {"BLOCK_I": bi, "BLOCK_K": bk, "num_warps": w, "num_stages": s, **({"TMA": 1} if tma else {})}


def _dn(bh: int, bk: int, w: int, s: int) -> dict:
    return {"BLOCK_H": bh, "BLOCK_K": bk, "num_warps": w, "num_stages": s}


GATE_UP = {
    32: [_gu(64, 64, 4, 4), _gu(128, 64, 4, 4), _gu(128, 64, 8, 4), _gu(256, 64, 8, 3), _gu(128, 128, 8, 3)],
    64: [
        _gu(64, 64, 4, 4),
        _gu(64, 64, 4, 5),
        _gu(64, 64, 4, 3),
        _gu(64, 32, 4, 6),
        _gu(128, 32, 8, 6),
        _gu(128, 64, 8, 4),
        _gu(128, 64, 8, 3),
        _gu(256, 64, 8, 3),
        _gu(256, 64, 8, 2),
        _gu(64, 128, 4, 3),
        _gu(64, 64, 4, 4, tma=0),
    ],  # fmt: skip
}
DOWN = {
    32: [_dn(128, 64, 4, 3), _dn(256, 64, 8, 3), _dn(256, 128, 8, 3)],
    64: [
        _dn(128, 64, 4, 3),
        _dn(128, 64, 4, 4),
        _dn(256, 64, 8, 3),
        _dn(256, 32, 8, 5),
        _dn(128, 32, 4, 5),
        _dn(512, 64, 8, 2),
    ],  # fmt: skip
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="128,1024")
    ap.add_argument("--committed", action="store_true", help="only the committed plan of each length")
    a = ap.parse_args()
    layer = t.make_inputs(init=True)
    gu_bytes, dn_bytes = 2 * t.I * t.H * 2, t.H * t.I * 2  # one expert's gate_up / down weights
    for T in (int(v) for v in a.tokens.split(",")):
        x = t.make_x(T, init=True)
        experts = moved_bytes(x, layer, t.TOP_K)[1] + 1  # the routed ones touched, and the shared one
        plan = get_plan(T, t.E, t.H, t.I, t.TOP_K, torch.bfloat16)
        print(f"T={T}: {experts} experts with the shared one; committed plan {plan}")
        rows = [(plan["block_m"], "gate_up", plan["gate_up"]), (plan["block_m"], "down", plan["down"])]
        if T >= 512 and not a.committed:
            rows += [(bm, "gate_up", c) for bm in (64, 32) for c in GATE_UP[bm]]
            rows += [(bm, "down", c) for bm in (64, 32) for c in DOWN[bm]]
        routes, hs, gu_cfg = {}, {}, {}
        for bm, kind, cfg in rows:
            if bm not in routes:
                routes[bm] = t.route(layer, x, bm)
            rt = routes[bm]
            if kind == "gate_up":
                gu_cfg.setdefault(bm, cfg)
                ms = t.time_graph(lambda rt=rt, bm=bm, cfg=cfg, x=x: t.run_gate_up(layer, x, rt, bm, cfg))
                nbytes = experts * gu_bytes
            else:
                if bm not in hs:
                    hs[bm] = t.run_gate_up(layer, x, rt, bm, gu_cfg[bm])
                h = hs[bm]
                ms = t.time_graph(
                    lambda rt=rt, bm=bm, cfg=cfg, h=h, T=T: t.run_down("scatter", layer, h, rt, bm, T, cfg)
                )
                nbytes = experts * dn_bytes
            print(
                f"  bm={bm:3d} {kind:7s} {ms * 1e3:8.1f} us {nbytes / ms / 1e9:6.2f} TB/s  {cfg}", flush=True
            )


if __name__ == "__main__":
    main()
