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
