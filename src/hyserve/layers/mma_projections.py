"""The routed in-projections streamed at one token, and with ``--mma-experts`` the experts' weights in prefills and
batched decode, as fragment-ordered 12-bit copies (optional features: ``--no-mma-projections`` turns the first off;
``kernels/mma_gemv`` has the format and the GEMV, ``kernels/moe/mma_grouped.py`` the expert kernels).

Each MoE decoder layer's in-projection with the router's rows (``RoutedProjections.w_in``: in_proj or qkv, plus
256 rows) keeps a lossless 12-bit copy in ``mma.m16n8k16`` fragment order, which the one-token step streams instead
of the bf16 weight (``kernels/mma_gemv``): the same values, 0.75 of the bytes, decoded into tensor-core operands;
so does its routing out-projection (``w_out``: M's 256 rows, then out_proj or o_proj) where the mma table has a
plan with a KSPLIT for its shape (``kernels/routed_projection/mma_kernel.py``; none has: slower than the bf16
kernel). The bf16 weights stay for everything else (prefills, larger batches, the reference path), so the copies
cost 0.75 of their weights' bytes in memory: ~1.5 GB for Qwen3.6-35B-A3B's 40 in-projections.
"""

from __future__ import annotations

import torch
from torch import nn

from hyserve.kernels.mma_gemv import mma_plan, pack_mma
from hyserve.kernels.moe.mma_experts import pack_mma_experts


def prepare_mma_projections(model: nn.Module) -> int:
    """Attach the copies to every routed in-projection whose shape the GEMV takes, and to every routing
    out-projection ([M; W_o]) whose shape has a plan with a KSPLIT (``routed_projection/mma_kernel.py``); returns
    their bytes."""
    total = 0
    for layer in model.model.layers:
        routed = getattr(getattr(layer, "mlp", None), "routed", None)
        if routed is None or routed.w_in.dtype != torch.bfloat16:
            continue
        n, k = routed.w_in.shape
        if routed.n_in % 16 == 0 and k % 64 == 0 and mma_plan(n, k) is not None:
            routed.w_in_mma = pack_mma(routed.w_in)
            total += routed.w_in_mma.nbytes
        n, k = routed.w_out.shape
        plan = mma_plan(n, k)  # None unless its SPLIT x KSPLIT cut K into whole chunks
        if plan is not None and "KSPLIT" in plan and routed.num_experts % 16 == 0 and k % 64 == 0:
            routed.w_out_mma = pack_mma(routed.w_out)
            total += routed.w_out_mma.nbytes
    return total


def prepare_mma_experts(model: nn.Module) -> int:
    """``--mma-experts``: the gate_up and the down weights of every routed MoE block (routed experts and the shared
    expert) as fragment-ordered 12-bit copies, which the grouped expert kernels of prefills and batched decode
    (``moe/mma_grouped.py``) and the one-token gate_up and down (``moe/mma_pairs.py``) stream; returns the copies'
    bytes (~48.8 GB for Qwen3.6-35B-A3B)."""
    total = 0
    for layer in model.model.layers:
        moe = getattr(layer, "mlp", None)
        if not hasattr(moe, "experts") or moe.experts.gate_up_proj.dtype != torch.bfloat16:
            continue  # a dense layer, or weights of another dtype
        w, shared = moe.experts.gate_up_proj.data, moe.shared_expert.gate_up_proj.weight.data
        if shared.shape != w.shape[1:] or w.shape[1] % 128 or w.shape[2] % 64:
            continue  # pack_mma_experts' shapes (K % 64 for both copies: H, and I = 2I / 2)
        moe.packed = pack_mma_experts(
            w, shared, moe.experts.down_proj.data, moe.shared_expert.down_proj.weight.data
        )
        total += moe.packed.nbytes
    return total
