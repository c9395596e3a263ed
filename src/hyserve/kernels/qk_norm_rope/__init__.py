"""Per-head q/k RMSNorm (zero-centred) followed by partial NeoX rotary on the first ``rotary_dim`` dims."""

from hyserve.kernels.qk_norm_rope.reference import qk_norm_rope_reference, rope_cos_sin

qk_norm_rope = qk_norm_rope_reference

__all__ = ["qk_norm_rope", "qk_norm_rope_reference", "rope_cos_sin"]
