"""The routed in-projections streamed at one token, and with ``--mma-experts`` the experts' weights in prefills and
batched decode, as fragment-ordered 12-bit copies (optional features: ``--no-mma-projections`` turns the first off;
``kernels/mma_gemv`` has the format and the GEMV, ``kernels/moe/mma_grouped.py`` the expert kernels).

Each MoE decoder layer's in-projection with the router's rows (``RoutedProjections.w_in``: in_proj or qkv, plus
256 rows) keeps a lossless 12-bit copy in ``mma.m16n8k16`` fragment order, which the one-token step streams instead
of the bf16 weight (``kernels/mma_gemv``): the same values, 0.75 of the bytes, decoded into tensor-core operands;
so does its routing out-projection (``w_out``: M's 256 rows, then out_proj or o_proj) where the mma table has a
plan with a KSPLIT for its shape (``kernels/routed_projection/mma_kernel.py``; none has: slower than the bf16
kernel). The bf16 weights stay for everything else (prefills, larger batches, the reference path), so the copies
cost 0.75 of their weights' bytes in memory: ~1.5 GB for Qwen3.6-35B-A3B's 40 in-projections. The experts' copies
(~48.8 GB) likewise, unless ``--mma-experts-only`` releases the bf16 experts, which every expert path can then do
without (``triton_moe`` re-plans their token counts onto the grouped 12-bit kernels).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace

import torch
from torch import nn

from hyserve.kernels.mma_gemv import mma_plan, pack_mma
from hyserve.kernels.moe.mma_experts import (
    MmaExperts,
    pack_mma_experts,
    shape_only,
    unpack_mma_down,
    unpack_mma_experts,
)
from hyserve.layers.sources import get_sources, resolve_key

log = logging.getLogger(__name__)


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


def prepare_mma_experts(model: nn.Module, release: bool = False) -> int:
    """``--mma-experts``: the gate_up and the down weights of every routed MoE block (routed experts and the shared
    expert) as fragment-ordered 12-bit copies, which the grouped expert kernels of prefills and batched decode
    (``moe/mma_grouped.py``) and the one-token gate_up and down (``moe/mma_pairs.py``) stream; returns the copies'
    bytes (~48.8 GB for Qwen3.6-35B-A3B). With ``release`` (``--mma-experts-only``) each block whose copy every
    expert kernel takes gives up its bf16 routed experts right after its copy is made: the parameters keep their
    shapes as zero-byte views, and the model's memory falls by the difference (~64.4 GB bf16 for ~48.8 GB of
    copies); the bf16 reference path then refuses those blocks (``moe.fused_moe``)."""
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
        if release and copies_take_every_path(moe.packed, w.shape[2]):
            moe.packed = replace(moe.packed, released=True)
            for param in (moe.experts.gate_up_proj, moe.experts.down_proj):
                param.data = shape_only(param.data)
    if release and torch.cuda.is_available():
        torch.cuda.empty_cache()  # the KV cache is sized from the driver's free memory
    return total


def expandable_memory() -> None:
    """Let the CUDA caching allocator give released pages back to the driver (expandable segments), for
    ``prepare_mma_experts(release=True)``: set before the model is built. Without it each released 1.07 GB expert
    tensor's segment is reused in part by the copies and the packing's temporaries, and the remainder (~11-16 GB of
    the full model) stays reserved where ``mem_get_info`` cannot see it, so the KV cache sized from the driver's
    free memory came out near zero on an H100 (docs/performance.md, 2026-12-07)."""
    try:
        # torch 2.11 deprecates this setter (a FutureWarning a start); it is the one verified on the GPU here
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    except (AttributeError, RuntimeError) as exc:  # a torch without the setting: the cache is only smaller
        log.warning(
            "expandable CUDA memory segments unavailable (%s): the released experts may stay reserved", exc
        )


def copies_take_every_path(packed: MmaExperts, hidden: int) -> bool:
    """Whether the grouped kernels over the copy take every block size ``triton_moe`` routes a copies-only block to
    (a token whose given routing the one-token kernels do not take is routed again, through them)."""
    from hyserve.kernels.moe.mma_grouped import grouped_mma_takes
    from hyserve.kernels.moe.triton_moe import COPIES_BLOCK_MS

    return packed.down is not None and all(grouped_mma_takes(packed, bm, hidden) for bm in COPIES_BLOCK_MS)


def _released_blocks(model: nn.Module):
    """(name, MoE block, its copies) of each block whose bf16 experts ``prepare_mma_experts(release=True)`` released."""
    for name, module in model.named_modules():
        packed = getattr(module, "packed", None)
        if isinstance(packed, MmaExperts) and packed.released:
            yield name, module, packed


def released_expert_nbytes(model: nn.Module) -> int:
    """The bytes ``released_expert_weights`` allocates (~64.4 GB for Qwen3.6-35B-A3B)."""
    return sum(
        t.numel() * t.element_size()  # the released parameters keep their shapes (``shape_only``)
        for _, module, _ in _released_blocks(model)
        for t in (module.experts.gate_up_proj, module.experts.down_proj)
    )


def released_expert_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Checkpoint key -> the bf16 weight unpacked from its copy, for each routed-expert weight that
    ``prepare_mma_experts(release=True)`` released (``hyserve verify``'s transformers model needs real tensors:
    ``released_expert_nbytes``, allocated here)."""
    out = {}
    for name, module, packed in _released_blocks(model):
        w, _ = unpack_mma_experts(packed)
        wd, _ = unpack_mma_down(packed)
        prefix = f"{name}.experts"
        for attr, value in (("gate_up_proj", w), ("down_proj", wd)):
            for source in get_sources(module.experts, attr)[0]:
                if not source.index:  # the fused layout: the parameter itself
                    out[resolve_key(prefix, source.key)] = value
    return out
