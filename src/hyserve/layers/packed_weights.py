"""``--pack-weights``: lossless 12-bit copies of the weights that decode steps stream (an optional feature;
``kernels/packed_bf16`` has the format, docs/kernels.md the kernels over it).

A packed copy changes no value: it only moves 0.75 of the bytes. On the H200 (2026-12-05, docs/performance.md)
its kernels take as long as the bf16 ones or longer, being bound by the decode's instructions: off by default. Packed here, and streamed by:
- each mixer's in- and out-projection with the router's rows (``RoutedProjections.w_in``, ``w_out``): the packed
  GEMV and the packed routing out-projection at one token;
- any other ``Linear`` whose GEMV the packed table covers (a layer without the routed projections);
- each MoE block's experts, the shared expert folded in (``kernels/moe/triton_pairs_packed.py``): the few-token
  kernels (batches of up to 4 tokens).
The bf16 weights stay for the rest (cuBLAS projections of prefills and batches over a few tokens, the grouped
MoE kernels of prefills and larger batches, the reference path), so the copies cost 0.75 of their weights' bytes in memory:
~50 GB for Qwen3.6-35B-A3B, nearly all of it the experts. Not packed: the LM head (its greedy screen is int8).
"""

from __future__ import annotations

import torch
from torch import nn

from hyserve.kernels.linear import packed_gemv_plan
from hyserve.kernels.moe.triton_pairs_packed import pack_experts
from hyserve.kernels.packed_bf16 import pack_bf16
from hyserve.layers.linear import Linear
from hyserve.layers.routed_projection import mixer_projections


def prepare_packed_weights(model: nn.Module) -> int:
    """Attach the packed copies to ``model`` (bf16 weights only); returns the bytes they take."""
    total = 0
    routed_out = set()
    for layer in model.model.layers:
        moe = getattr(layer, "mlp", None)
        if hasattr(moe, "experts") and moe.experts.gate_up_proj.dtype == torch.bfloat16:
            shared = moe.shared_expert
            moe.packed = pack_experts(
                moe.experts.gate_up_proj.data,
                moe.experts.down_proj.data,
                shared.gate_up_proj.weight.data,
                shared.down_proj.weight.data,
            )
            total += moe.packed.nbytes
        routed = getattr(moe, "routed", None)
        if routed is None:
            continue
        in_proj, out_proj = mixer_projections(layer)
        routed_out.update((id(in_proj), id(out_proj)))  # the routed kernels stream these at one token
        if routed.w_in.dtype == torch.bfloat16 and packed_gemv_plan(*routed.w_in.shape) is not None:
            routed.w_in_packed = pack_bf16(routed.w_in)
            total += routed.w_in_packed.nbytes
        if routed.w_out.dtype == torch.bfloat16 and packed_gemv_plan(*routed.w_out.shape) is not None:
            routed.w_out_packed = pack_bf16(routed.w_out)
            total += routed.w_out_packed.nbytes
    for name, module in model.named_modules():
        # the LM head has its greedy screen; the shared expert's weights stream inside the MoE kernels
        skip = name.endswith("lm_head") or ".shared_expert" in name
        if not isinstance(module, Linear) or id(module) in routed_out or skip:
            continue
        weight = module.weight
        if weight.dtype == torch.bfloat16 and weight.shape[1] % 8 == 0 and packed_gemv_plan(*weight.shape):
            module.packed = pack_bf16(weight.data)
            total += module.packed.nbytes
    return total
