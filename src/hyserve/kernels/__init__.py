"""Kernels as ops: one folder per op, each with a plain-PyTorch reference beside its fast version.

Model code calls the functions exported here and never a kernel directly. Every op dispatches on
its inputs: the Triton kernel where one exists for the device and dtype, else the reference.
``use_reference()`` forces the references (the accuracy gate compares both paths).
"""

from hyserve.kernels.activation import silu_and_mul
from hyserve.kernels.argmax import logits_argmax
from hyserve.kernels.attention import causal_attention, decode_attention, paged_attention, store_kv
from hyserve.kernels.causal_conv1d import (
    causal_conv1d_decode,
    causal_conv1d_prefill,
    causal_conv1d_prefill_gated,
)
from hyserve.kernels.dispatch import reference_only, use_reference
from hyserve.kernels.gated_delta_rule import gated_delta_rule_decode, gated_delta_rule_prefill
from hyserve.kernels.gated_rmsnorm import gated_rms_norm
from hyserve.kernels.gdn_decode_step import gdn_decode_step
from hyserve.kernels.gdn_gating import gdn_gating
from hyserve.kernels.linear import linear
from hyserve.kernels.moe import fused_moe
from hyserve.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_store, rope_cos_sin
from hyserve.kernels.rmsnorm import rms_norm

__all__ = [
    "causal_attention",
    "causal_conv1d_decode",
    "causal_conv1d_prefill",
    "causal_conv1d_prefill_gated",
    "decode_attention",
    "fused_moe",
    "gated_delta_rule_decode",
    "gated_delta_rule_prefill",
    "gated_rms_norm",
    "gdn_decode_step",
    "gdn_gating",
    "linear",
    "logits_argmax",
    "paged_attention",
    "qk_norm_rope",
    "qk_norm_rope_store",
    "reference_only",
    "rms_norm",
    "rope_cos_sin",
    "silu_and_mul",
    "store_kv",
    "use_reference",
]
