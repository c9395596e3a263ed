"""screened_greedy: the Triton kernels and the torch screen against the full LM head's argmax (same token on
fresh random heads, with ties, near-ties, a zero hidden state), the bound itself, and the state left reset."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.greedy_head import build_greedy_screen, greedy_reference, screened_greedy_reference
from hyserve.kernels.greedy_head.reference import split_limbs
from hyserve.kernels.greedy_head.triton_kernel import screened_greedy_triton

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float16
SHAPES = [(3001, 300), (1024, 64)] + ([(248320, 2048)] if CUDA else [])
PLANS = [(64, 128, 4, 0), (16, 64, 4, 0), (32, 128, 4, 3)]


def _head(v: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(v, k, generator=gen) * 0.02).to(DTYPE)
    x = torch.randn(8, k, generator=gen).to(DTYPE)
    return weight.to(DEVICE), x.to(DEVICE)


def test_the_bound_holds_on_every_row():
    weight, x = _head(4000, 256, 0)
    weight[7] = 0  # an all-zero row
    weight[9, 3] = 50  # a row with an outlier: a coarse scale
    screen = build_greedy_screen(weight)
    xf = x.float().double()
    exact = xf @ weight.double().T
    approx = (xf @ screen.q.double().T) * screen.scale.double()
    assert ((exact - approx).abs() <= screen.radius.double() * xf.norm(dim=1, keepdim=True)).all()
    assert screen.radius[7] == 0 and screen.nbytes == 4000 * 256 + 3 * 4000 * 4
    p1, p2, s1, s2, e = split_limbs(x)  # the limbs: x = s1 p1 + s2 p2 + e, |e| <= s2 / 2
    assert p1.abs().max() <= 127 and p2.abs().max() <= 127
    assert torch.allclose(s1 * p1 + s2 * p2 + e, x.float(), rtol=0, atol=1e-6)
    assert (e.abs() <= s2 * 0.5001).all()


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_reference_screen_matches_the_full_head(rows):
    weight, x = _head(*SHAPES[0], seed=rows)
    tokens, computed = screened_greedy_reference(x[:rows], weight, build_greedy_screen(weight))
    assert tokens.tolist() == greedy_reference(x[:rows], weight).tolist()
    assert (computed >= 1).all() and (computed < SHAPES[0][0] // 10).all()  # the screen screens


ROWS = [1, 2, 4]
# every plan at every row count on the small head; on the CPU (the interpreter) the larger head takes each plan at
# one row count, in turn, which keeps every pair of the three covered at a third of the time
CASES = [(SHAPES[1], rows, plan) for plan in PLANS for rows in ROWS] + [
    (shape, rows, plan)
    for shape in SHAPES[:1] + SHAPES[2:]
    for i, plan in enumerate(PLANS)
    for rows in (ROWS if CUDA else ROWS[i % 3 : i % 3 + 1])
]


@pytest.mark.parametrize(
    ("shape", "rows", "plan"), CASES, ids=[f"{s[0]}x{s[1]}-rows{r}-plan{PLANS.index(p)}" for s, r, p in CASES]
)
def test_triton_matches_the_full_head(shape, rows, plan):
    weight, x = _head(*shape, seed=shape[0] + rows)
    weight[shape[0] - 1] = weight[shape[0] // 2]  # a duplicate row: an exact tie, the earlier row must win
    x[0] = x[0] * 0
    x[0, 0] = 1  # row 0 picks a single column of W: its logits tie often after rounding
    screen = build_greedy_screen(weight)
    count = torch.zeros(rows, dtype=torch.int64, device=DEVICE)
    got = screened_greedy_triton(x[:rows], weight, screen, screen_plan=plan, count=count)
    want = greedy_reference(x[:rows], weight)
    assert got.tolist() == want.tolist()
    assert (count >= 1).all()
    again = screened_greedy_triton(x[:rows], weight, screen, screen_plan=plan)
    assert again.tolist() == want.tolist()  # the state was reset


@pytest.mark.parametrize("plan", PLANS)
def test_triton_with_no_screening_possible(plan):
    """A zero hidden state makes every logit 0: every row is a candidate, the first one wins; near-equal rows
    make most rows candidates."""
    v, k = 2000, 64
    weight, x = _head(v, k, seed=5)
    x[0] = 0
    base = torch.randn(k, device=DEVICE)
    weight[:] = (base + 1e-3 * torch.randn(v, k, device=DEVICE)).to(DTYPE)
    screen = build_greedy_screen(weight)
    count = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    got = screened_greedy_triton(x[:2], weight, screen, screen_plan=plan, count=count)
    assert got.tolist() == greedy_reference(x[:2], weight).tolist()
    assert got[0] == 0 and count[0] == v


def test_dispatch(monkeypatch):
    from hyserve.kernels.greedy_head import screened_greedy

    weight, x = _head(1500, 64, seed=9)
    screen = build_greedy_screen(weight)
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    assert screened_greedy(x[:1], weight, screen).tolist() == greedy_reference(x[:1], weight).tolist()
    with pytest.raises(ValueError, match="screened_greedy takes"):
        screened_greedy(x[:, :32], weight, screen)
