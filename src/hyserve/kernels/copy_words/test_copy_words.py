"""copy_words: the kernel against torch's copies, device and pinned host memory on either side (GPU), the
interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.copy_words import copy_words
from hyserve.kernels.copy_words.reference import copy_words_reference
from hyserve.kernels.copy_words.triton_kernel import copy_words_triton

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _words(n: int, seed: int) -> torch.Tensor:
    return torch.randint(
        -(2**31), 2**31 - 1, (n,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32
    )


@pytest.mark.parametrize("n, m", [(1, 0), (5, 4), (1023, 0), (1024, 2), (1025, 1024), (3000, 96)])
def test_kernel_matches_torch(n, m):
    src = _words(n, n).to(DEVICE)
    overlay = _words(m, m + 1).to(DEVICE) if m else None
    got = torch.full((n + 7,), -1, dtype=torch.int32, device=DEVICE)  # poison past the copy
    want = got.clone()
    copy_words_triton(src, got, overlay)
    copy_words_reference(src, want, overlay)
    assert torch.equal(got, want)
    assert (got[n:] == -1).all()


@pytest.mark.skipif(not CUDA, reason="pinned host memory is read and written by a kernel on a GPU")
@pytest.mark.parametrize("direction", ["to_device", "to_host"])
def test_pinned_host_memory_either_side(direction):
    # int64 values whose two 32-bit words both vary
    rows = torch.arange(40, dtype=torch.int64).reshape(5, 8) * 1_000_000_007
    ids = torch.tensor([11, -3, 2**40], dtype=torch.int64, device="cuda")
    if direction == "to_device":
        src, dst = rows.pin_memory(), torch.zeros(5, 8, dtype=torch.int64, device="cuda")
    else:
        src, dst = rows.cuda(), torch.zeros(5, 8, dtype=torch.int64).pin_memory()
    copy_words(src, dst, overlay=ids)
    torch.cuda.synchronize()
    want = rows.clone()
    want.view(-1)[:3] = ids.cpu()
    assert torch.equal(dst.cpu(), want)


def test_op_checks_its_inputs_and_falls_back_to_torch(monkeypatch):
    with pytest.raises(ValueError, match="whole number of 4-byte words"):
        copy_words(torch.zeros(3, dtype=torch.uint8), torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="dst holds 1 words, src 2"):
        copy_words(torch.zeros(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="overlay must be int64"):
        copy_words(torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32), torch.zeros(1))
    with pytest.raises(ValueError, match="overlay holds 4 words, src only 2"):
        copy_words(
            torch.zeros(2, dtype=torch.int32),
            torch.zeros(4, dtype=torch.int32),
            torch.zeros(2, dtype=torch.long),
        )
    src, dst = torch.arange(6, dtype=torch.int64), torch.zeros(6, dtype=torch.int64)
    monkeypatch.setenv("HYSERVE_KERNELS", "reference")
    assert copy_words(src, dst, overlay=torch.tensor([9])).tolist() == [9, 1, 2, 3, 4, 5]
