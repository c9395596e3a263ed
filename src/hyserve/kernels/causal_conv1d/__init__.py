"""Causal depthwise conv1d + SiLU over the Gated DeltaNet [q | k | v] channels, with a per-sequence state.

The conv state of a sequence is the last ``W - 1`` inputs it has seen, laid out ``[W - 1, D]`` (oldest
first) in slot ``state_indices[i]`` of a pool ``conv_state [num_slots, W - 1, D]``.
"""

from hyserve.kernels.causal_conv1d.reference import (
    causal_conv1d_decode_reference,
    causal_conv1d_prefill_reference,
)

causal_conv1d_prefill = causal_conv1d_prefill_reference
causal_conv1d_decode = causal_conv1d_decode_reference

__all__ = [
    "causal_conv1d_decode",
    "causal_conv1d_decode_reference",
    "causal_conv1d_prefill",
    "causal_conv1d_prefill_reference",
]
