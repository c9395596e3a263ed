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


def _rows(w: torch.Tensor) -> torch.Tensor | None:
    """[E, N, K] as [E*N, K] without a copy (or a 2-D w as it is); None where the experts' rows do not follow
    each other in memory."""
    if w.dim() == 2:
        return w
    return w.view(-1, w.shape[-1]) if w.stride(0) == w.shape[1] * w.stride(1) else None


def expert_descriptors(w: torch.Tensor, shared: torch.Tensor, block: list[int]) -> tuple | None:
    """Descriptors of the routed experts' weights [E, N, K] as one [E*N, K] matrix (expert e's row r is row
    e*N + r) and of the shared expert's [N', K] (or another [E, N, K]), both with ``block`` boxes; None unless
    both can be made."""
    rows, shared_rows = _rows(w), _rows(shared)
    if rows is None or shared_rows is None:
        return None
    descs = descriptor(rows, block), descriptor(shared_rows, block)
    return descs if None not in descs else None
