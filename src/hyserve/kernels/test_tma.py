"""``kernels/tma.py``: when a weight gets a TMA descriptor and when its kernel must fall back to pointer loads."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels import tma

pytestmark = pytest.mark.skipif(tma.TensorDescriptor is None, reason="Triton without host tensor descriptors")


def test_descriptor_of_a_contiguous_weight() -> None:
    w = torch.zeros(64, 256, dtype=torch.bfloat16)
    d = tma.descriptor(w, [4, 256])
    assert d is not None and list(d.block_shape) == [4, 256] and list(d.shape) == [64, 256]


@pytest.mark.parametrize(
    "make, block",
    [
        (lambda: torch.zeros(64, 512, dtype=torch.bfloat16), [4, 512]),  # a box side over 256
        (lambda: torch.zeros(64, 256, dtype=torch.bfloat16)[:, 1:], [4, 128]),  # base not 16-byte aligned
        (lambda: torch.zeros(64, 20, dtype=torch.bfloat16), [4, 16]),  # rows of 40 bytes
        (lambda: torch.zeros(256, 64, dtype=torch.bfloat16).t(), [4, 64]),  # columns not contiguous
        (lambda: torch.zeros(4, 64, 64, dtype=torch.bfloat16), [4, 64]),  # not 2-D
    ],
)
def test_no_descriptor_where_tma_cannot_stream(make, block) -> None:
    assert tma.descriptor(make(), block) is None


def test_expert_descriptors_flatten_the_experts() -> None:
    """The routed experts [E, N, K] as one [E*N, K] matrix (no copy) beside the shared expert's [N', K]."""
    w = torch.zeros(4, 32, 64, dtype=torch.bfloat16)
    shared = torch.zeros(16, 64, dtype=torch.bfloat16)
    descs = tma.expert_descriptors(w, shared, [8, 64])
    assert descs is not None
    assert list(descs[0].shape) == [128, 64] and descs[0].base.data_ptr() == w.data_ptr()
    assert list(descs[1].shape) == [16, 64] and list(descs[1].block_shape) == [8, 64]


def test_no_expert_descriptors_where_either_cannot_stream() -> None:
    shared = torch.zeros(16, 64, dtype=torch.bfloat16)
    gapped = torch.zeros(4, 48, 64, dtype=torch.bfloat16)[:, :32]  # experts' rows not back to back
    assert tma.expert_descriptors(gapped, shared, [8, 64]) is None
    w = torch.zeros(4, 32, 64, dtype=torch.bfloat16)
    assert tma.expert_descriptors(w, shared[:, 1:], [8, 32]) is None  # the shared expert's base unaligned
