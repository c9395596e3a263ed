"""The greedy token without reading the whole LM head (batch <= 4, greedy requests without logprobs).

At batch 1 the LM head (248320 x 2048 bf16) is 1.02 GB of the ~6 GB a token reads. A greedy request needs its
argmax only: an int8 copy of the head (``build_greedy_screen``, half the bytes, made once at load) gives every
logit to within a proven radius, and only the rows that can still be the maximum are computed exactly from
the bf16 head. The token is the first maximum of the bf16-rounded logits, as ``logits_argmax`` of the full
head gives (``reference.py`` proves the bound; the tests compare tokens on fresh random heads, ties included).
Triton (``triton_kernel.py``, three launches) for N <= 4 rows and K a multiple of 4 on CUDA or the interpreter;
else the reference.
"""

from __future__ import annotations

import torch

from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.greedy_head.reference import (
    GreedyScreen,
    build_greedy_screen,
    greedy_reference,
    screened_greedy_reference,
)

MAX_ROWS = 4  # rows of x one launch takes


def screened_greedy(x: torch.Tensor, weight: torch.Tensor, screen: GreedyScreen) -> torch.Tensor:
    """x [N, K] hidden states (after the final norm), weight [V, K] the LM head, screen its
    ``build_greedy_screen`` -> the greedy token of each row [N] int64."""
    if x.dim() != 2 or x.shape[1] != weight.shape[1] or screen.q.shape != weight.shape:
        raise ValueError(
            f"screened_greedy takes x [N, K] with weight [V, K] and its screen, got x {tuple(x.shape)}, "
            f"weight {tuple(weight.shape)}, screen {tuple(screen.q.shape)}"
        )
    if (
        triton_enabled(x, weight)
        and x.shape[0] <= MAX_ROWS
        and x.shape[1] % 4 == 0
        and weight.is_contiguous()
    ):
        from hyserve.kernels.greedy_head.triton_kernel import screened_greedy_triton

        return screened_greedy_triton(x, weight, screen)
    return screened_greedy_reference(x, weight, screen)[0]


__all__ = [
    "MAX_ROWS",
    "GreedyScreen",
    "build_greedy_screen",
    "greedy_reference",
    "screened_greedy",
    "screened_greedy_reference",
]
