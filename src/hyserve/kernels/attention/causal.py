"""Causal attention of new tokens over themselves alone: a prompt's prefill without a cached prefix.

``causal_attention(q, k, v, scale, gate)``: q [T, Hq, D], k, v [T, Hkv, D] (strided views with a unit last
stride), gate None or [T, Hq, D] -> out [T, Hq, D] contiguous: ``softmax(q k^T scale, causal) v`` per head (GQA:
query head h reads KV head h // (Hq / Hkv)), times ``sigmoid(gate)``. The same rows as ``paged_attention`` when
the context is exactly these tokens, without reading them back from the paged cache: on CUDA (fp16 / bf16) it
is torch's SDPA (GQA native), then the gate in one Triton pass (``triton_gate.py``); elsewhere the reference.

The backend: inside ``graph_backend()`` (the prefill graphs' warm-up and capture of their fixed buckets) cuDNN, a
FlashAttention-3 class kernel on Hopper (at 1024 / 4096 tokens, 16 query and 2 KV heads, D 256: 33 / 262 us on the
H200 against 72 / 757 for ``triton_prefill``; docs/performance.md). cuDNN builds an execution plan for every new
shape, reported at tens to hundreds of milliseconds (flashinfer-ai/flashinfer#5245, modelscope/FunASR#3704): paid
once per bucket in the warm-up before the capture, but it would be paid per prompt length in an eager prefill, so
every other call (an eager prefill past the largest bucket or without graphs) takes the flash backend, which plans
nothing (63 / 543 us). Math last, where flash (and in the graphs cuDNN) does not take the operands. The
warm-up must take cuDNN too: a process's first cuDNN call cannot be captured (``cudaErrorStreamCaptureInvalidated``,
H100 2026-12-06), and the caller, not the stream's capture state, decides, so a warm-up and its capture run the
same kernel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from hyserve.kernels.dispatch import reference_only, triton_enabled


def causal_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, gate: torch.Tensor | None = None
) -> torch.Tensor:
    """The definition in plain torch: scores and softmax in fp32, the output rounded to q's dtype, then
    ``o * sigmoid(gate)`` (as ``paged_attention_reference`` does)."""
    group = q.shape[1] // k.shape[1]
    keys = k.float().repeat_interleave(group, dim=1)
    values = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), keys) * scale
    t = q.shape[0]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
    out = torch.einsum("hqk,khd->qhd", probs, values).to(q.dtype)
    if gate is not None:
        out = out * torch.sigmoid(gate.view_as(out))
    return out.contiguous()


_graph_backend = False  # inside graph_backend(): cuDNN first


@contextlib.contextmanager
def graph_backend() -> Iterator[None]:
    """Inside: ``causal_attention`` takes cuDNN first (module docstring). For a CUDA graph's eager warm-up and its
    capture together; not reentrant across threads (the engine captures on one)."""
    global _graph_backend
    before, _graph_backend = _graph_backend, True
    try:
        yield
    finally:
        _graph_backend = before


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal GQA SDPA on [1, H, T, D] views through the first backend of the order that takes them (module
    docstring), one backend enabled at a time: with several enabled and ``set_priority=True``, torch 2.11 ran the
    first call of a process on cuDNN even where flash came first, and every later call on flash (H100,
    2026-12-06: a fresh engine's first eager prefill gave other bits than the same prompt again)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.FLASH_ATTENTION]
    if _graph_backend:
        order.insert(0, SDPBackend.CUDNN_ATTENTION)
    for backend in order:
        try:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        except RuntimeError:  # "No available kernel": this backend does not take these operands
            pass
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, gate: torch.Tensor | None = None
) -> torch.Tensor:
    """See the module docstring."""
    t, hq, d = q.shape
    if k.shape != v.shape or k.shape[0] != t or k.shape[2] != d or hq % k.shape[1]:
        raise ValueError(
            f"causal_attention takes q [T, Hq, D], k and v [T, Hkv, D] with Hkv dividing Hq, got q "
            f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and not reference_only()):
        return causal_attention_reference(q, k, v, scale, gate)
    o = _sdpa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], scale)
    o = o[0].transpose(0, 1)
    if gate is None:
        return o.contiguous()
    gate = gate.view(t, hq, d)
    if triton_enabled(o, gate) and o.stride(-1) == 1 and gate.stride(-1) == 1:
        from hyserve.kernels.attention.triton_gate import sigmoid_gate_triton

        return sigmoid_gate_triton(o, gate)
    return (o * torch.sigmoid(gate)).contiguous()
