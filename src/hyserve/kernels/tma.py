"""Host side of the kernels' TMA options: a Hopper tensor descriptor for a 2-D weight, or None where TMA
cannot stream it (then the kernel takes its pointer loads).

A descriptor describes a [rows, cols] tensor and the box one copy moves (``block``: at most 256 elements a
side, 16-byte aligned base and row stride). The launch encodes it on the host and passes it by value, so a
CUDA graph keeps it. The CPU interpreter emulates the copies, so the kernel tests cover the TMA paths.
"""

from __future__ import annotations

import torch

try:  # the host-side descriptor (Triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - an older Triton: the TMA options are ignored
    TensorDescriptor = None


def descriptor(t: torch.Tensor, block: list[int]):
    """A TensorDescriptor of the 2-D ``t`` with ``block`` boxes, or None (no TMA: pre-Hopper GPU, a box
    side over 256, unaligned base or rows, a non-unit column stride)."""
    if TensorDescriptor is None or t.dim() != 2 or t.stride(1) != 1 or max(block) > 256:
        return None
    if t.is_cuda and torch.cuda.get_device_capability(t.device)[0] < 9:
        return None
    if t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16 or (block[1] * t.element_size()) % 16:
        return None
    return TensorDescriptor.from_tensor(t, block)
