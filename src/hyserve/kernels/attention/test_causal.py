"""causal_attention: its reference against the paged reference over a cache holding the same rows; the op (cuDNN /
flash SDPA and the Triton gate on a GPU, the reference on the CPU) against its reference; the Triton gate alone
in the interpreter. Inputs are strided views, as the model passes them (k and v slices of one projection, the
gate interleaved with the queries)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from hyserve.kernels.attention import (
    causal_attention,
    causal_attention_reference,
    graph_backend,
    paged_attention_reference,
)
from hyserve.kernels.attention.triton_gate import sigmoid_gate_triton
from hyserve.kernels.testing import rel_err

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}


def _rows(t, hq, hkv, d, dtype, seed=0):
    """q [T, Hq, D] and gate as the halves of one [T, Hq, 2D] projection; k, v slices of one [T, 2 Hkv D] one."""
    gen = torch.Generator().manual_seed(seed)
    qg = torch.randn(t, hq, 2 * d, generator=gen).to(dtype).to(DEVICE)
    q, gate = qg.chunk(2, dim=-1)
    kv = torch.randn(t, 2 * hkv * d, generator=gen).to(dtype).to(DEVICE)
    k, v = kv.view(t, 2 * hkv, d).split(hkv, dim=1)
    return q, k, v, 2 * gate


SHAPES = [(37, 4, 2, 16), (64, 8, 1, 32)] + ([(1024, 16, 2, 256), (300, 16, 2, 256)] if CUDA else [])


@pytest.mark.parametrize("t,hq,hkv,d", SHAPES)
def test_reference_equals_the_paged_reference(t, hq, hkv, d):
    """The rows as the whole context of one sequence in a paged cache (pages out of order)."""
    q, k, v, gate = _rows(t, hq, hkv, d, torch.float32)
    page = 16
    blocks = -(-t // page)
    order = torch.randperm(blocks + 2, generator=torch.Generator().manual_seed(1))[:blocks].to(DEVICE)
    k_cache = torch.full((blocks + 2, page, hkv, d), float("nan"), device=DEVICE)
    v_cache = torch.full_like(k_cache, float("nan"))
    pos = torch.arange(t, device=DEVICE)
    slots = order[pos // page] * page + pos % page
    k_cache.view(-1, hkv, d)[slots] = k
    v_cache.view(-1, hkv, d)[slots] = v
    cu = torch.tensor([0, t], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([t], dtype=torch.int32, device=DEVICE)
    paged = paged_attention_reference(q, k_cache, v_cache, cu, lens, order[None].int(), d**-0.5, gate)
    assert rel_err(causal_attention_reference(q, k, v, d**-0.5, gate), paged) < 1e-6


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("t,hq,hkv,d", SHAPES)
def test_op_matches_reference(t, hq, hkv, d, dtype, gated):
    q, k, v, gate = _rows(t, hq, hkv, d, dtype, seed=t)
    gate = gate if gated else None
    got = causal_attention(q, k, v, d**-0.5, gate)
    want = causal_attention_reference(q, k, v, d**-0.5, gate)
    assert got.shape == (t, hq, d) and got.is_contiguous() and not got.isnan().any()
    assert rel_err(got, want) < TOL[dtype]


@pytest.mark.skipif(not CUDA, reason="CUDA graphs")
@pytest.mark.parametrize("cudnn", [True, False], ids=["graph_backend", "default"])
@pytest.mark.parametrize("t", [1024, 300])
def test_captured_op_matches_reference(t, cudnn):
    """In a CUDA graph, replayed on new inputs copied into the captured ones: under ``graph_backend()`` (the prefill
    graphs' path: cuDNN, its first call of the process in the eager warm-up) and without it (flash)."""
    q, k, v, gate = _rows(t, 16, 2, 256, torch.bfloat16, seed=11)
    with graph_backend() if cudnn else contextlib.nullcontext():
        # the gate kernel's compile and, under graph_backend(), cuDNN's first call and plan: outside the capture
        causal_attention(q, k, v, 256**-0.5, gate)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = causal_attention(q, k, v, 256**-0.5, gate)
    q2, k2, v2, gate2 = _rows(t, 16, 2, 256, torch.bfloat16, seed=12)
    for dst, src in ((q, q2), (k, k2), (v, v2), (gate, gate2)):
        dst.copy_(src)
    graph.replay()
    assert rel_err(out, causal_attention_reference(q2, k2, v2, 256**-0.5, gate2)) < TOL[torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_gate(dtype):
    q, _, _, gate = _rows(5, 3, 1, 24, dtype, seed=2)
    o = q * 0.5  # a strided view's values in a contiguous tensor
    got = sigmoid_gate_triton(o, gate, block=32)
    want = (o.float() * torch.sigmoid(gate.float())).to(dtype)
    assert got.is_contiguous() and rel_err(got, want) < TOL[dtype]


def test_bad_shapes_raise():
    q, k, v, _ = _rows(8, 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="Hkv dividing Hq"):
        causal_attention(q, k[:4], v[:4], 0.25)


@pytest.mark.parametrize("cudnn", [True, False], ids=["graph_backend", "default"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_backend_loop_matches_the_reference(dtype, cudnn):
    """``_sdpa`` (one backend at a time, the first that takes the operands) on this machine's tensors: on the CPU
    torch's CPU flash kernel or math (cuDNN refuses CPU tensors), on a GPU cuDNN under ``graph_backend()``, else
    flash."""
    from hyserve.kernels.attention.causal import _sdpa

    q, k, v, _ = _rows(64, 8, 2, 32, dtype)
    with graph_backend() if cudnn else contextlib.nullcontext():
        got = _sdpa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], 0.2)
    want = causal_attention_reference(q.float(), k.float(), v.float(), 0.2)
    assert rel_err(got[0].transpose(0, 1).float(), want) < TOL[dtype]


def test_graph_backend_nests_and_restores():
    from hyserve.kernels.attention import causal

    with graph_backend():
        with graph_backend():
            assert causal._graph_backend
        assert causal._graph_backend
    assert not causal._graph_backend
    with pytest.raises(KeyError), graph_backend():
        raise KeyError
    assert not causal._graph_backend


@pytest.mark.skipif(not CUDA, reason="the first SDPA call of a process picks the backend on a GPU")
def test_first_call_of_a_process_equals_the_next():
    """A fresh process's first causal_attention gives the bits of its second (torch 2.11 with a backend priority
    list ran the first call on cuDNN and the rest on flash)."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from hyserve.kernels.attention.causal import causal_attention\n"
        "g = torch.Generator(device='cuda').manual_seed(0)\n"
        "r = lambda *s: torch.randn(*s, device='cuda', generator=g).bfloat16()\n"
        "q, k, v, gate = r(384, 16, 256), r(384, 2, 256), r(384, 2, 256), r(384, 16, 256)\n"
        "o = [causal_attention(q, k, v, 0.0625, gate=gate) for _ in range(3)]\n"
        "assert torch.equal(o[0], o[1]) and torch.equal(o[1], o[2])\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
