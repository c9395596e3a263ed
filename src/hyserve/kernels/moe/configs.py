"""Launch configs of the fused MoE, as data.

One JSON file per weight shape and dtype, ``configs/E{E}_H{H}_I{I}_{dtype}.json`` (it covers both GEMMs
of the layer: gate_up is E x N=2I x K=H, down is E x N=H x K=I). The file maps a token-count bucket
(the smallest bucket >= T is used; past the largest, the largest) to one plan:

    {"block_m": 16,                 # rows per expert block: shared by the routing, gate_up and down
     "down_mode": "reduce",         # "reduce" (decode kernel, T <= 128), "scatter" (prefill kernels) or
                                    # "pairs" (few tokens: triton_pairs; its "down" has BLOCK_H, BLOCK_I,
                                    # "router_be" sets the fused router's experts per program)
     "fused_router": true,          # optional: router GEMV fused into the routing kernel (T*k <= 1024)
     "large_routing": false,        # optional: the multi-kernel grouping even where one program could
     "atomic_routing": false,       # optional: the multi-kernel grouping by atomic ranks (two launches,
                                    # not three; ``routing.py``)
     "split_shared": false,         # optional, "pairs": the shared expert's gate_up in a launch of its own
                                    # before the routed pairs', which then stream before their PDL wait
     "topk_in_experts": false,      # optional, "pairs" + fused_router: the router stops at the logits and
                                    # the expert kernels take each token's top-k (no ticket, no ids trip)
     "mma_grouped": true,           # optional, with --mma-experts: false keeps this bucket's grouped
                                    # kernels on the bf16 weights where ``mma_grouped.PLANS`` would take the
                                    # 12-bit copies (ignored once the bf16 experts are released)
     "gate_up": {"BLOCK_I": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4},
     "down": {"BLOCK_H": 16, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4}}

``block_m < 16`` selects the GEMV (no tensor core) variants and requires ``down_mode == "reduce"``. The
"pairs" kernels' ``gate_up`` / ``down`` configs may add ``REDUCE_EACH`` and ``PREFETCH`` (``triton_pairs``); the
"scatter" ones ``EVICT`` (L2 eviction hints: h and y kept for their next kernel, the weights evicted first;
``triton_gate_up``, ``triton_prefill``).
Without a file, ``default_plan`` gives sane untuned values; ``tune.py`` writes the file on the H200.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
import triton

CONFIG_DIR = Path(__file__).parent / "configs"
DECODE_MAX_T = 64  # default threshold: T <= this takes the "reduce" (decode) down kernel


def config_path(E: int, H: int, inter: int, dtype: torch.dtype) -> Path:
    return CONFIG_DIR / f"E{E}_H{H}_I{inter}_{str(dtype).removeprefix('torch.')}.json"


@functools.cache
def _table(E: int, H: int, inter: int, dtype: torch.dtype) -> dict[int, dict] | None:
    path = config_path(E, H, inter, dtype)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return {int(k): v for k, v in data["buckets"].items()}


def _clamp(block: int, size: int, floor: int) -> int:
    return max(floor, min(block, triton.next_power_of_2(size)))


def default_plan(T: int, E: int, H: int, inter: int, top_k: int) -> dict:
    """Untuned but sane: weight streaming for decode, grouped GEMM tiles for prefill."""
    if T <= DECODE_MAX_T:
        plan = {
            "block_m": 16,
            "down_mode": "reduce",
            "fused_router": True,
            "gate_up": {
                "BLOCK_I": 16 if T <= 8 else 32,
                "BLOCK_K": 256 if T <= 8 else 128,
                "num_warps": 4,
                "num_stages": 4,
            },
            "down": {"BLOCK_H": 16, "BLOCK_K": 128, "num_warps": 4, "num_stages": 6},
        }
    else:
        per_expert = T * top_k / max(E, 1)
        bm = 16 if per_expert <= 16 else 32 if per_expert <= 32 else 64 if per_expert <= 96 else 128
        big = bm >= 128
        plan = {
            "block_m": bm,
            "down_mode": "scatter",
            "gate_up": {"BLOCK_I": 64, "BLOCK_K": 64, "num_warps": 8 if big else 4, "num_stages": 3},
            "down": {"BLOCK_H": 128, "BLOCK_K": 64, "num_warps": 8 if big else 4, "num_stages": 3},
        }
    return plan


def fit_plan(plan: dict, H: int, inter: int) -> dict:
    """Clamp tile sizes to the problem (small test shapes); never below 16 where a tl.dot takes them."""
    gu, dn = dict(plan["gate_up"]), dict(plan["down"])
    if plan["down_mode"] == "pairs":  # GEMV kernels: any power of two fits
        gu["BLOCK_I"] = _clamp(gu["BLOCK_I"], inter, 1)
        gu["BLOCK_K"] = _clamp(gu["BLOCK_K"], H, 16)
        dn["BLOCK_H"] = _clamp(dn["BLOCK_H"], H, 1)
        dn["BLOCK_I"] = _clamp(dn["BLOCK_I"], inter, 16)
        return dict(plan, gate_up=gu, down=dn)
    f = 16 if plan["block_m"] >= 16 else 1
    gu["BLOCK_I"] = _clamp(gu["BLOCK_I"], inter, f)
    gu["BLOCK_K"] = _clamp(gu["BLOCK_K"], H, 16)
    dn["BLOCK_H"] = _clamp(dn["BLOCK_H"], H, f)
    dn["BLOCK_K"] = _clamp(dn["BLOCK_K"], inter, 16)
    out = dict(plan, gate_up=gu, down=dn)
    if out["block_m"] < 16:
        out["down_mode"] = "reduce"
    return out


def get_plan(T: int, E: int, H: int, inter: int, top_k: int, dtype: torch.dtype) -> dict:
    table = _table(E, H, inter, dtype)
    if table:
        keys = sorted(table)
        bucket = next((k for k in keys if k >= T), keys[-1])
        plan = table[bucket]
    else:
        plan = default_plan(T, E, H, inter, top_k)
    return fit_plan(plan, H, inter)
