"""``--pack-weights``: 12-bit copies of the weights that the batch-1 decode step streams through the GEMV (an
optional feature; ``kernels/packed_bf16`` has the format, ``kernels/linear/triton_packed.py`` the kernel).

The format is lossless, so a packed copy changes no value: it only moves 0.75 of the bytes. The bf16 weight
stays for everything else (prefill and larger batches through cuBLAS, the reference path), so the copies cost
0.75 of their weights' bytes in memory.

Packed here: each mixer's in- and out-projection as the one-token step runs them (with the router's rows when
the routed projections are on, ``RoutedProjections.w_in`` and ``w_out``: the routing out-projection's own packed
kernel), any other ``Linear`` whose GEMV the packed table covers, and each MoE block's experts (gate_up and down, the shared expert folded in:
``kernels/moe/triton_pairs_packed.py``, for the few-token path). The experts' copies are the bulk: ~48 GB
for Qwen3.6-35B-A3B next to its 64 GB of bf16 experts, which the prefill and larger batches keep reading.
Not packed: the LM head (its greedy screen is int8).
"""

from __future__ import annotations

import torch
from torch import nn

from hyserve.kernels.linear import packed_gemv_plan
from hyserve.kernels.moe.triton_pairs_packed import pack_experts
from hyserve.kernels.packed_bf16 import pack_bf16
from hyserve.layers.linear import Linear


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
        mixer = getattr(layer, "linear_attn", None) or layer.self_attn
        in_proj = mixer.in_proj if hasattr(mixer, "in_proj") else mixer.qkv_proj
        out_proj = mixer.out_proj if hasattr(mixer, "out_proj") else mixer.o_proj
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
