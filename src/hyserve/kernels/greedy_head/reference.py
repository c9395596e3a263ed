"""Reference: the greedy token of each row (the LM head's argmax) two ways, in plain torch.

``greedy_reference`` is the definition: every logit computed, rounded to the weight's dtype (as the LM head's
output is), the first maximum. ``screened_greedy_reference`` is the screened algorithm the Triton kernels run,
step by step, so its bound can be checked on the CPU at full size: an int8 copy of the LM head gives every
logit to within a proven radius, and only the rows whose upper bound reaches the best lower bound are
computed exactly.

The screen. Row i of W [V, K] is stored as q_i (int8) times scale_i = max_k |W_ik| / 127, so W_i = Ŵ_i + E_i
with Ŵ_i = scale_i q_i. The hidden row x [K] is split into two int8 limbs, x = s1 p1 + s2 p2 + e with s1 =
max |x| / 127, s2 = s1 / 127 (|e_k| <= s2 / 2), so the screened logit a_i = scale_i (s1 q_i.p1 + s2 q_i.p2)
needs only integer dot products (``dp4a``: four int8 products a 32-bit instruction, no conversion of the
weights) and fp32 for the last few products.

The bound. ``e_i - a_i = E_i.x + Ŵ_i.e + rounding``, so by Cauchy-Schwarz ``|e_i - a_i| <= radius_i ||x|| +
wnorm_i ||e||`` with ``radius_i = (||E_i|| + EPS_SCREEN ||Ŵ_i|| + EPS_EXACT ||W_i||) (1 + 2^-10)`` and
``wnorm_i = ||Ŵ_i|| (1 + 2^-10)``. EPS_EXACT covers the rounding of the exact K-term fp32 sum that decides
the winner (at most K 2^-24 of sum_k |W_ik x_k| <= ||W_i|| ||x||: 1.2e-4 at K = 2048), EPS_SCREEN the fp32
steps of the screen (the int32 sums are exact; the limbs' fp32 residues and the last products, ~1e-6), the
last factor the rounding of the norms themselves; ||x|| and ||e|| are taken 2^-10 high as well. So e_i lies
in [a_i - b_i, a_i + b_i]. Let L be the largest lower bound. The winner's logit, rounded to bf16 (or fp16:
at most 2^-8 relative either way), is at least L rounded, so its exact value is at least L - 2^-7 |L|; a row
whose upper bound is below ``L - 2^-6 |L|`` can neither win nor tie, and the winner (with all its ties) is
among the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EPS_SCREEN = 1e-4
EPS_EXACT = 5e-4
NORM_MARGIN = 1.0 + 2.0**-10
SLACK = 2.0**-6  # of |L|: the bf16 rounding of the winner's logit, twice over


@dataclass(frozen=True)
class GreedyScreen:
    """The LM head's screen, derived once from its weight W [V, K] at load."""

    q: torch.Tensor  # [V, K] int8: round(W / scale), K contiguous
    scale: torch.Tensor  # [V] fp32: max_k |W_ik| / 127
    radius: torch.Tensor  # [V] fp32: the bound's term per unit of ||x||_2 (see the module)
    wnorm: torch.Tensor  # [V] fp32: the bound's term per unit of ||e||_2, the limbs' residue

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.scale, self.radius, self.wnorm))


@torch.no_grad()
def build_greedy_screen(weight: torch.Tensor, chunk_rows: int = 8192) -> GreedyScreen:
    """weight [V, K] (bf16 / fp16 / fp32) -> its ``GreedyScreen`` on the same device (fp32 math, in chunks of
    rows so the temporaries stay small next to the 1 GB head)."""
    v, k = weight.shape
    q = torch.empty((v, k), dtype=torch.int8, device=weight.device)
    scale = torch.empty(v, dtype=torch.float32, device=weight.device)
    radius = torch.empty(v, dtype=torch.float32, device=weight.device)
    wnorm = torch.empty(v, dtype=torch.float32, device=weight.device)
    for start in range(0, v, chunk_rows):
        w = weight[start : start + chunk_rows].float()
        s = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
        qi = torch.round(w / s[:, None]).clamp_(-127, 127)
        deq = qi * s[:, None]
        err, dnorm = (w - deq).norm(dim=1), deq.norm(dim=1)
        q[start : start + chunk_rows] = qi.to(torch.int8)
        scale[start : start + chunk_rows] = s
        radius[start : start + chunk_rows] = (
            err + EPS_SCREEN * dnorm + EPS_EXACT * w.norm(dim=1)
        ) * NORM_MARGIN
        wnorm[start : start + chunk_rows] = dnorm * NORM_MARGIN
    return GreedyScreen(q=q, scale=scale, radius=radius, wnorm=wnorm)


def split_limbs(
    x: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [N, K] -> (p1, p2 [N, K] int32 in [-127, 127], s1, s2 [N, 1] fp32, e [N, K] fp32): x = s1 p1 + s2 p2 + e
    (``floor(v + 0.5)`` rounding, as the kernel does it)."""
    xf = x.float()
    s1 = (xf.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-30)  # 1 / s2 stays finite for a zero row
    p1 = torch.floor(xf * (1.0 / s1) + 0.5).clamp(-127, 127)
    r1 = xf - s1 * p1
    s2 = s1 / 127.0
    p2 = torch.floor(r1 * (1.0 / s2) + 0.5).clamp(-127, 127)
    return p1.int(), p2.int(), s1, s2, r1 - s2 * p2


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
    p1, p2, s1, s2, e = split_limbs(x)
    q = screen.q.double()  # the integer sums, exact in float64
    approx = (s1 * (p1.double() @ q.T).float() + s2 * (p2.double() @ q.T).float()) * screen.scale  # [N, V]
    x_norm = xf.norm(dim=1, keepdim=True) * NORM_MARGIN
    bound = screen.radius * x_norm + screen.wnorm * (e.norm(dim=1, keepdim=True) * NORM_MARGIN)
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
