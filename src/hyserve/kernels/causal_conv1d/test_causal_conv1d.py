"""causal_conv1d_prefill: the reference vs a float64 loop; the Triton kernel vs the reference.

Sequences shorter than W-1 (their new state mixes old state and new tokens), empty sequences, with and
without initial state (those slots hold NaN: they must not be read), unused slots untouched.
"""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.causal_conv1d.reference import causal_conv1d_prefill_reference
from hyserve.kernels.causal_conv1d.triton_kernel import causal_conv1d_prefill_triton
from hyserve.kernels.gdn_gating.reference import gdn_gating_reference
from hyserve.kernels.gdn_gating.triton_kernel import gdn_gating_triton
from hyserve.kernels.testing import rel_err

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def _no_tf32():
    """The reference's F.conv1d goes through cuDNN, which runs fp32 convs in TF32 unless told not to."""
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = previous


def _inputs(lens, d, width, dtype, seed=0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    n = len(lens)
    num_slots = n + 2
    x = torch.randn(sum(lens), d, generator=gen).to(dtype)
    weight = (torch.randn(d, width, generator=gen) * width**-0.5).to(dtype)
    state = torch.randn(num_slots, width - 1, d, generator=gen).to(dtype)
    slots = torch.randperm(num_slots, generator=gen)[:n]
    has_init = torch.tensor([i % 3 != 1 for i in range(n)])
    state[slots[~has_init]] = float("nan")
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return tuple(t.to(device) for t in (x, weight, state, cu, slots, has_init))


def _unused_equal(before, after, slots):
    mask = torch.ones(before.shape[0], dtype=torch.bool, device=before.device)
    mask[slots] = False
    return torch.equal(before[mask].nan_to_num(7.0), after[mask].nan_to_num(7.0))


def test_reference_matches_loop():
    lens, d, width = [1, 2, 5, 0, 9], 6, 4
    x, weight, state, cu, slots, init = _inputs(lens, d, width, torch.float32, device="cpu")
    s = state.clone()
    got = causal_conv1d_prefill_reference(x, weight, s, cu, slots, init)
    xd, wd = x.double(), weight.double()
    for i, slot in enumerate(slots.tolist()):
        hist = state[slot].double() if init[i] else torch.zeros(width - 1, d, dtype=torch.float64)
        seq = torch.cat([hist, xd[cu[i] : cu[i + 1]]])
        for t in range(lens[i]):
            y = (seq[t : t + width] * wd.t()).sum(0)
            assert rel_err(got[cu[i] + t], y * torch.sigmoid(y)) < 1e-6
        if lens[i]:
            assert torch.equal(s[slot].double(), seq[-(width - 1) :])
    assert _unused_equal(state, s, slots[torch.tensor(lens) > 0])


CASES = [
    ([1, 2, 3, 0, 70, 5], 40, 4, torch.float32, None, None),
    ([1, 2, 3, 0, 70, 5], 40, 4, torch.float32, 16, 16),  # many blocks per sequence, ragged D tiles
    ([4, 1, 33], 24, 3, torch.float16, 8, 32),
    ([2, 7], 16, 2, torch.float32, 4, 16),
    ([1, 9, 20], 32, 4, torch.float32, 4, 16),  # whole D tiles: interior blocks take the fast path
    ([3, 13], 32, 5, torch.float32, 4, 32),  # block_t = width - 1: block 1's first tap is the first token
]
if CUDA:
    CASES += [
        ([1, 2, 3, 0, 700, 5, 4096], 8192, 4, torch.bfloat16, None, None),
        ([1, 2, 3, 0, 70, 5], 40, 4, torch.bfloat16, None, None),
    ]


@pytest.mark.parametrize("lens,d,width,dtype,block_t,block_d", CASES)
def test_triton_matches_reference(lens, d, width, dtype, block_t, block_d):
    x, weight, state, cu, slots, init = _inputs(lens, d, width, dtype)
    s_ref, s_tri = state.clone(), state.clone()
    want = causal_conv1d_prefill_reference(x, weight, s_ref, cu, slots, init)
    out = torch.full_like(want, float("nan"))
    causal_conv1d_prefill_triton(x, weight, s_tri, cu, slots, init, block_t=block_t, block_d=block_d, out=out)
    assert not out.isnan().any()
    assert rel_err(out, want) < TOL[dtype]
    used = slots[torch.tensor(lens, device=slots.device) > 0]
    assert torch.equal(s_tri[used], s_ref[used])  # copies of inputs and old rows: exact
    assert _unused_equal(state, s_tri, used)


@pytest.mark.parametrize("block_t", [4, 8, 16])
def test_interior_fast_path_is_bit_identical(block_t):
    """The interior blocks' unmasked path gives the general path's output bit for bit, and the same state."""
    x, weight, state, cu, slots, init = _inputs([1, 9, 20, 6], 32, 4, torch.float32)
    outs, states = [], []
    for fast in (True, False):
        s = state.clone()
        outs.append(
            causal_conv1d_prefill_triton(
                x, weight, s, cu, slots, init, block_t=block_t, block_d=16, interior_fast_path=fast
            )
        )
        states.append(s)
    assert torch.equal(outs[0], outs[1]) and torch.equal(states[0], states[1])


def _gate_inputs(tokens, heads, dtype, seed=1):
    """a, b as the model passes them: [T, HV] views of one projection output (row stride > HV), A_log, dt_bias."""
    gen = torch.Generator().manual_seed(seed)
    proj = (4 * torch.randn(tokens, 2 * heads + 3, generator=gen)).to(dtype).to(DEVICE)
    a_log, dt_bias = (torch.randn(heads, generator=gen).to(DEVICE) for _ in range(2))
    return proj[:, 3 : 3 + heads], proj[:, 3 + heads :], a_log, dt_bias


GATED_CASES = [([1, 2, 3, 0, 70, 5], 40, 4, 6, torch.float32, 16), ([4, 1, 33], 32, 4, 32, torch.float16, 8)]
if CUDA:
    GATED_CASES += [([1, 2, 3, 0, 700, 5, 1024], 8192, 4, 32, torch.bfloat16, None)]


@pytest.mark.parametrize("lens,d,width,heads,dtype,block_t", GATED_CASES)
def test_gates_column(lens, d, width, heads, dtype, block_t):
    """With ``gates`` the conv output and state are the plain call's bit for bit, and g, beta (NaN-poisoned
    scratch is never seen: the wrapper allocates them, every row is checked) are ``gdn_gating_triton``'s bits and
    within fp32 rounding of the reference."""
    x, weight, state, cu, slots, init = _inputs(lens, d, width, dtype)
    a, b, a_log, dt_bias = _gate_inputs(x.shape[0], heads, dtype)
    s_plain, s_gated = state.clone(), state.clone()
    plain = causal_conv1d_prefill_triton(x, weight, s_plain, cu, slots, init, block_t=block_t)
    out, g, beta = causal_conv1d_prefill_triton(
        x, weight, s_gated, cu, slots, init, block_t=block_t, gates=(a, b, a_log, dt_bias)
    )
    assert torch.equal(out, plain) and torch.equal(s_gated.nan_to_num(7.0), s_plain.nan_to_num(7.0))
    g_kernel, beta_kernel = gdn_gating_triton(a, b, a_log, dt_bias)
    assert torch.equal(g, g_kernel) and torch.equal(beta, beta_kernel)
    g_ref, beta_ref = gdn_gating_reference(a, b, a_log, dt_bias)
    assert g.dtype == torch.float32 and beta.dtype == dtype
    assert rel_err(g, g_ref) < 1e-5 and rel_err(beta.float(), beta_ref.float()) < TOL[dtype]


def test_gated_dispatch(monkeypatch):
    """The op gives the conv and the gates on both paths (Triton, and the references it falls back to)."""
    import hyserve.kernels.causal_conv1d as op

    x, weight, state, cu, slots, init = _inputs([3, 5], 16, 4, torch.float32)
    gates = _gate_inputs(x.shape[0], 4, torch.float32)
    results = []
    for kernels in ("triton", "reference"):
        monkeypatch.setenv("HYSERVE_KERNELS", kernels)
        results.append(op.causal_conv1d_prefill_gated(x, weight, state.clone(), cu, slots, init, *gates))
    for got, want in zip(*results):
        assert rel_err(got, want) < 1e-5


def test_block_shorter_than_the_window_is_refused():
    x, weight, state, cu, slots, init = _inputs([5], 16, 4, torch.float32)
    with pytest.raises(ValueError, match="block_t must be at least"):
        causal_conv1d_prefill_triton(x, weight, state, cu, slots, init, block_t=2)


def test_dispatch(monkeypatch):
    import hyserve.kernels.causal_conv1d as op

    x, weight, state, cu, slots, init = _inputs([3, 5], 16, 4, torch.float32)
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    s1, s2 = state.clone(), state.clone()
    got = op.causal_conv1d_prefill(x, weight, s1, cu, slots, init)
    assert rel_err(got, causal_conv1d_prefill_reference(x, weight, s2, cu, slots, init)) < 1e-5
