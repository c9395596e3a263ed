"""SwiGLU activation ``silu(gate) * up`` over a fused [gate | up] projection."""

from hyserve.kernels.activation.reference import silu_and_mul_reference

silu_and_mul = silu_and_mul_reference

__all__ = ["silu_and_mul", "silu_and_mul_reference"]
