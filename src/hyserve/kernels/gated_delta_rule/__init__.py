"""The gated delta rule of Gated DeltaNet, with an fp32 recurrent state per sequence.

Per value head, with q and k L2-normalised inside the op and q scaled by ``K ** -0.5``::

    S_t = exp(g_t) * S_{t-1} + beta_t * k_t (v_t - exp(g_t) * S_{t-1}^T k_t)^T      S: [K, V]
    o_t = S_t^T q_t

Key head ``j`` serves value heads ``j * HV/H .. (j+1) * HV/H - 1``. The state of a sequence lives in
slot ``state_indices[i]`` of a pool ``state [num_slots, HV, K, V]`` (fp32) and is updated in place.
``prefill`` is the chunked form for many tokens per sequence; ``decode`` the recurrent form for one.
"""

from hyserve.kernels.gated_delta_rule.reference import (
    gated_delta_rule_decode_reference,
    gated_delta_rule_prefill_reference,
)

gated_delta_rule_prefill = gated_delta_rule_prefill_reference
gated_delta_rule_decode = gated_delta_rule_decode_reference

__all__ = [
    "gated_delta_rule_decode",
    "gated_delta_rule_decode_reference",
    "gated_delta_rule_prefill",
    "gated_delta_rule_prefill_reference",
]
