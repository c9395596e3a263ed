"""A copy of 32-bit words by a kernel, for the few hundred bytes that go between host and device each decode step.

Pinned host memory (``Tensor.pin_memory()``) is mapped into the device's address space (unified addressing), so
a kernel can read the host's staging of a step or write its tokens back directly. A ``cudaMemcpyAsync`` of the
same bytes takes a copy engine: between two graph replays on the H200 each such copy took ~1-2.5 us plus a
1.5-4 us gap as the stream switched between the compute and copy engines. This kernel stays on the compute
engine (1.2 us out, 2.6 in, the host's PCIe read latency): the batch-1 engine step less its replay went from
21-27 to 16 us (docs/performance.md, 2026-12-04).

``overlay`` (int64) replaces the first words of the copy: a launched-ahead step's input ids, which the device
has (the previous step's tokens) and the host staging does not.

Triton (``triton_kernel.py``) for CUDA and the interpreter; the reference is two torch copies.
"""

from __future__ import annotations

import torch

from hyserve.kernels.copy_words.reference import copy_words_reference
from hyserve.kernels.dispatch import reference_only, triton_enabled


def _words(t: torch.Tensor, name: str) -> torch.Tensor:
    """t's bytes as int32 words (t contiguous, a whole number of words)."""
    if not t.is_contiguous() or t.numel() * t.element_size() % 4:
        raise ValueError(f"copy_words: {name} must be contiguous and a whole number of 4-byte words")
    return t.reshape(-1).view(torch.int32)


def _kernel_ok(tensors: list[torch.Tensor]) -> bool:
    """The kernel where it can reach every tensor: device memory and pinned host memory with a CUDA tensor
    among them (a kernel cannot read pageable host memory), else the CPU interpreter's rules."""
    if any(t.is_cuda for t in tensors):
        return not reference_only() and all(t.is_cuda or t.is_pinned() for t in tensors)
    return triton_enabled(*tensors)


def copy_words(src: torch.Tensor, dst: torch.Tensor, overlay: torch.Tensor | None = None) -> torch.Tensor:
    """dst's first bytes = src's bytes, except the first ``8 * overlay.numel()`` bytes = overlay [M] int64;
    returns dst. src and dst are contiguous tensors of any dtype, each on the device or in pinned host memory,
    dst at least as long as src (in bytes); with overlay, src at least as long as overlay."""
    s, d = _words(src, "src"), _words(dst, "dst")
    if d.numel() < s.numel():
        raise ValueError(f"copy_words: dst holds {d.numel()} words, src {s.numel()}")
    o = None
    if overlay is not None:
        if overlay.dtype != torch.int64:
            raise ValueError(f"copy_words: overlay must be int64, got {overlay.dtype}")
        o = _words(overlay, "overlay")
        if o.numel() > s.numel():
            raise ValueError(f"copy_words: overlay holds {o.numel()} words, src only {s.numel()}")
    if _kernel_ok([t for t in (src, dst, overlay) if t is not None]):
        from hyserve.kernels.copy_words.triton_kernel import copy_words_triton

        copy_words_triton(s, d, o)
        return dst
    copy_words_reference(s, d, o)
    return dst


__all__ = ["copy_words", "copy_words_reference"]
