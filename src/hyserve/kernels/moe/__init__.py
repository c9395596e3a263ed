"""The sparse MoE block: fp32 softmax router, top-k, renormalise, SwiGLU experts, sigmoid-gated shared expert.

Expert weights are stacked: ``w_gate_up [E, 2I, H]`` (rows 0..I-1 gate, I..2I-1 up) and
``w_down [E, H, I]``; the shared expert is ``shared_gate_up [2Is, H]``, ``shared_down [H, Is]`` with its
scalar gate ``shared_expert_gate [1, H]``.
"""

from hyserve.kernels.moe.reference import fused_moe_reference, route_reference

fused_moe = fused_moe_reference

__all__ = ["fused_moe", "fused_moe_reference", "route_reference"]
