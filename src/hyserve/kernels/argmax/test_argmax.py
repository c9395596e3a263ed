"""logits_argmax: the Triton kernel against torch (upcast bit-exact, the same index on ties, NaN, -0.0)."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.argmax.reference import logits_argmax_reference
from hyserve.kernels.argmax.triton_kernel import logits_argmax_triton

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SHAPES = [(1, 5000), (3, 4097), (2, 17)] + ([(1, 248320), (32, 248320), (5, 70000)] if CUDA else [])
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_matches_torch(shape, dtype):
    n, v = shape
    gen = torch.Generator().manual_seed(n * v)
    x = (3 * torch.randn(n, v, generator=gen)).to(dtype)
    x[0, v // 3] = x[0, v - 1] = x[0].max() + 1  # a tie across programs: the first column wins
    if n > 1:
        x[1] = -float("inf")  # every value equal
        x[1, v // 2] = float("nan")  # NaN is the maximum, as torch picks it
    if n > 2:
        x[2] = -x[2].abs() - 1
        x[2, v - 2], x[2, 5] = 0.0, -0.0  # -0.0 == +0.0: the earlier column
    x = x.to(DEVICE)
    got, ids = logits_argmax_triton(x)
    want, want_ids = logits_argmax_reference(x)
    assert got.dtype == torch.float32 and torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    assert ids.tolist() == want_ids.tolist()
    assert logits_argmax_triton(x)[1].tolist() == ids.tolist()  # the counter was reset


def test_dispatch(monkeypatch):
    from hyserve.kernels.argmax import logits_argmax

    x = torch.randn(2, 3000).to(DEVICE)
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    assert logits_argmax(x)[1].tolist() == x.argmax(-1).tolist()


def test_counters_grow_outside_a_capture_and_keep_the_old(monkeypatch):
    from hyserve.kernels import tickets

    monkeypatch.setattr(tickets, "_COUNTERS", {})
    cpu = torch.device("cpu")
    small = tickets.ticket_counters("logits_argmax", cpu, 4, minimum=8)
    assert tickets.ticket_counters("logits_argmax", cpu, 8) is small
    assert tickets.ticket_counters("another kernel", cpu, 4) is not small  # each kernel owns its counters
    grown = tickets.ticket_counters("logits_argmax", cpu, 9)
    assert grown.numel() >= 9 and any(t is small for t in tickets._OUTGROWN)  # graphs may still use the old
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="before CUDA-graph capture"):
        tickets.ticket_counters("logits_argmax", torch.device("cuda", 0), 1)
