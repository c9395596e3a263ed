"""The Gated DeltaNet output norm: ``w * rmsnorm(o) * silu(z)`` per head (plain ``w``, not ``1 + w``)."""

from hyserve.kernels.gated_rmsnorm.reference import gated_rms_norm_reference

gated_rms_norm = gated_rms_norm_reference

__all__ = ["gated_rms_norm", "gated_rms_norm_reference"]
