"""The LM head: the logits, or only the greedy token through an int8 screen of the head (an optional feature:
``prepare_greedy_screen`` at load, +0.5 GB for the 248320 x 2048 head; ``kernels/greedy_head`` proves the
token is the full head's)."""

from __future__ import annotations

import torch

from hyserve import kernels as ops
from hyserve.kernels.greedy_head import MAX_ROWS, GreedyScreen, build_greedy_screen, screened_greedy
from hyserve.layers.linear import Linear


class LMHead(Linear):
    """weight: [vocab, hidden] (checkpoint key ``lm_head.weight``, or the tied embedding)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features)
        self.screen: GreedyScreen | None = None

    def prepare_greedy_screen(self) -> int:
        """Build the int8 screen from the loaded weight; returns its size in bytes."""
        self.screen = build_greedy_screen(self.weight)
        return self.screen.nbytes

    @property
    def screens(self) -> bool:
        """Whether ``greedy`` skips most of the head for up to ``MAX_ROWS`` rows."""
        return self.screen is not None

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [L, hidden] -> each row's greedy token [L] int64 (the first maximum of the logits)."""
        if self.screen is not None and hidden.shape[0] <= MAX_ROWS:
            return screened_greedy(hidden, self.weight, self.screen)
        return ops.logits_argmax(self(hidden))[1]
