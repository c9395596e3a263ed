"""The routed in-projections streamed at one token as fragment-ordered 12-bit copies (an optional feature,
``--no-mma-projections`` turns it off; ``kernels/mma_gemv`` has the format and the kernel).

Each MoE decoder layer's in-projection with the router's rows (``RoutedProjections.w_in``: in_proj or qkv, plus
256 rows) keeps a lossless 12-bit copy in ``mma.m16n8k16`` fragment order, which the one-token step's GEMV
streams instead of the bf16 weight: the same values, 0.75 of the bytes, decoded into tensor-core operands. The
bf16 weights stay for everything else (prefills, larger batches, the reference path), so the copies cost 0.75 of
their weights' bytes in memory: ~1.5 GB for Qwen3.6-35B-A3B's 40 in-projections.
"""

from __future__ import annotations

import torch
from torch import nn

from hyserve.kernels.mma_gemv import mma_plan, pack_mma


def prepare_mma_projections(model: nn.Module) -> int:
    """Attach the copies to every routed in-projection whose shape the kernel takes; returns their bytes."""
    total = 0
    for layer in model.model.layers:
        routed = getattr(getattr(layer, "mlp", None), "routed", None)
        if (
            routed is None
            or routed.w_in.dtype != torch.bfloat16
            or routed.n_in % 16
            or routed.w_in.shape[0] % 16
        ):
            continue
        if mma_plan(*routed.w_in.shape) is None or routed.w_in.shape[1] % 64:
            continue
        routed.w_in_mma = pack_mma(routed.w_in)
        total += routed.w_in_mma.nbytes
    return total
