"""Reference: the greedy token of each row (the LM head's argmax) two ways, in plain torch.

``greedy_reference`` is the definition: every logit computed, rounded to the weight's dtype (as the LM head's
output is), the first maximum. ``screened_greedy_reference`` is the screened algorithm the Triton kernels run,
step by step, so its bound can be checked on the CPU at full size: an int8 copy of the LM head gives every
logit to within a proven radius, and only the rows whose upper bound reaches the best lower bound are
computed exactly.

The bound. Row i of W [V, K] is stored as q_i (int8) times scale_i = max_k |W_ik| / 127, so W_i = scale_i q_i
+ E_i. For the row x [K] of hidden states, with e_i the exact product W_i . x and a_i the screened one,
``|e_i - a_i| <= |E_i . x| + fp32 rounding of both sums <= radius_i ||x||_2`` by Cauchy-Schwarz, where
``radius_i = (||E_i|| + EPS_SCREEN ||scale_i q_i|| + EPS_EXACT ||W_i||) (1 + 2^-10)``. The EPS terms cover the
rounding of a K-term fp32 sum (at most K 2^-24 of sum |W_ik x_k| <= ||W_i|| ||x||, 1.2e-4 at K = 2048; the
screen's tensor-core sums are given 8x that), the last factor the rounding of the norms themselves. So e_i
lies in [a_i - b_i, a_i + b_i] with b_i = radius_i ||x|| (||x|| taken 2^-10 high as well). Let L be the
largest lower bound. The winner m's logit, rounded to bf16 (or fp16: at most 2^-8 relative either way),
is at least L rounded, so its exact value is at least L - 2^-7 |L|; every row whose upper bound is below
``L - 2^-6 |L|`` can neither win nor tie, and the winner (with all its ties) is among the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EPS_SCREEN = 1e-3
EPS_EXACT = 5e-4
NORM_MARGIN = 1.0 + 2.0**-10
SLACK = 2.0**-6  # of |L|: the bf16 rounding of the winner's logit, twice over


@dataclass(frozen=True)
class GreedyScreen:
    """The LM head's screen, derived once from its weight W [V, K] at load."""

    q: torch.Tensor  # [V, K] int8: round(W / scale), K contiguous
    scale: torch.Tensor  # [V] fp32: max_k |W_ik| / 127
    radius: torch.Tensor  # [V] fp32: bound on |exact - screened logit| per unit of ||x||_2 (see the module)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.scale, self.radius))


@torch.no_grad()
def build_greedy_screen(weight: torch.Tensor, chunk_rows: int = 8192) -> GreedyScreen:
    """weight [V, K] (bf16 / fp16 / fp32) -> its ``GreedyScreen`` on the same device (fp32 math, in chunks of
    rows so the temporaries stay small next to the 1 GB head)."""
    v, k = weight.shape
    q = torch.empty((v, k), dtype=torch.int8, device=weight.device)
    scale = torch.empty(v, dtype=torch.float32, device=weight.device)
    radius = torch.empty(v, dtype=torch.float32, device=weight.device)
    for start in range(0, v, chunk_rows):
        w = weight[start : start + chunk_rows].float()
        s = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
        qi = torch.round(w / s[:, None]).clamp_(-127, 127)
        deq = qi * s[:, None]
        err = (w - deq).norm(dim=1)
        r = (err + EPS_SCREEN * deq.norm(dim=1) + EPS_EXACT * w.norm(dim=1)) * NORM_MARGIN
        q[start : start + chunk_rows] = qi.to(torch.int8)
        scale[start : start + chunk_rows] = s
        radius[start : start + chunk_rows] = r
    return GreedyScreen(q=q, scale=scale, radius=radius)


def greedy_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [N, K], weight [V, K] -> [N] int64: the first index of each row's largest logit, the logits computed in
    fp32 and rounded to the weight's dtype (what the LM head writes)."""
    logits = (x.float() @ weight.float().T).to(weight.dtype).float()
    return logits.argmax(dim=-1)


def screened_greedy_reference(
    x: torch.Tensor, weight: torch.Tensor, screen: GreedyScreen
) -> tuple[torch.Tensor, torch.Tensor]:
    """The screened algorithm in torch: x [N, K], weight [V, K] -> (greedy tokens [N] int64, the number of rows
    computed exactly [N] int64). The tokens equal ``greedy_reference`` up to the fp32 summation order."""
    xf = x.float()
    approx = (xf @ screen.q.float().T) * screen.scale  # [N, V]
    bound = screen.radius * (xf.norm(dim=1, keepdim=True) * NORM_MARGIN)
    lower_max = (approx - bound).amax(dim=1, keepdim=True)  # [N, 1]
    threshold = lower_max - SLACK * lower_max.abs()
    candidates = (approx + bound) >= threshold  # [N, V]
    tokens = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    for row in range(x.shape[0]):
        rows = candidates[row].nonzero().flatten()
        if rows.numel():
            exact = (weight[rows].float() @ xf[row]).to(weight.dtype).float()
            tokens[row] = rows[exact.argmax()]
    return tokens, candidates.sum(dim=1)
