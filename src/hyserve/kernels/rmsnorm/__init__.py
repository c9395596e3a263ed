"""Zero-centred RMSNorm ``x * rsqrt(mean(x^2) + eps) * (1 + w)``, optionally fused with the residual add."""

from hyserve.kernels.rmsnorm.reference import rms_norm_reference

rms_norm = rms_norm_reference

__all__ = ["rms_norm", "rms_norm_reference"]
