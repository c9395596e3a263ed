"""The kernel wrappers refuse a layout their kernel cannot read, with a ValueError that says what is required
(``kernels/contracts.py``), before anything is launched."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.causal_conv1d.triton_kernel import causal_conv1d_prefill_triton
from hyserve.kernels.contracts import require
from hyserve.kernels.moe.routing import route_and_align


def test_require_raises_the_contract() -> None:
    require(True, "unused")
    with pytest.raises(ValueError, match="^the contract$"):
        require(False, "the contract")


def test_conv_prefill_refuses_a_state_of_another_dtype() -> None:
    x = torch.zeros(6, 8)
    state = torch.zeros(2, 3, 8, dtype=torch.float16)
    args = (
        torch.zeros(8, 4),
        state,
        torch.tensor([0, 6], dtype=torch.int32),
        torch.tensor([0]),
        torch.tensor([False]),
    )
    with pytest.raises(ValueError, match="conv_state must have x's dtype"):
        causal_conv1d_prefill_triton(x, *args)
    with pytest.raises(ValueError, match="contiguous last dim"):
        causal_conv1d_prefill_triton(torch.zeros(8, 6).t(), args[0], state.float(), *args[2:])


def test_routing_refuses_strided_logits() -> None:
    with pytest.raises(ValueError, match="logits need a contiguous last dim"):
        route_and_align(torch.zeros(16, 4).t(), 2, 16, True, torch.float32)
