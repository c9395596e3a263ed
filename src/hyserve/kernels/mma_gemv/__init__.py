"""GEMV at one token over the lossless 12-bit weight format, on tensor cores: ``y = rms_norm(x) W^T``.

The batch-1 decode step streams its weights once per token, so its projections are bound by bytes. The
12-bit format (``kernels/packed_bf16``: each bf16 value's low byte and a 4-bit code against its row's window of
high bytes, escapes listed) moves 0.75 of the bytes for the same values, but decoding it costs instructions,
and the FMA forms of the GEMV in Triton issue too many to gain (docs/performance.md, "Lossless 12-bit
weights"). This op lays the format out in ``mma.m16n8k16``'s A-fragment order at load (``layout.py``) and
decodes each thread's weights straight into its A registers in a hand-written CUDA kernel (``cuda_kernel.py``,
compiled at run time by NVRTC), ~2.5 instructions an element.

Ops: ``pack_mma`` (at load), ``gemv_mma`` (x [1, K] bf16 on CUDA; the contract of ``gemv_mma_reference``).
Its plans (``configs/mma_gemv.json``, per weight shape: ``SPLIT``, the warps a 16-row tile's K is split over)
come from ``python -m hyserve.kernels.mma_gemv.bench --write`` on the GPU; a shape without a plan takes the
table's ``default``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from hyserve.kernels.contracts import require
from hyserve.kernels.mma_gemv.layout import MmaPackedBF16, pack_mma, unpack_mma
from hyserve.kernels.mma_gemv.reference import gemv_mma_reference
from hyserve.kernels.pdl import enabled as pdl_enabled

CONFIG_PATH = Path(__file__).parent / "configs" / "mma_gemv.json"


@functools.cache
def _plans() -> dict[str, dict]:
    return json.loads(CONFIG_PATH.read_text())["plans"] if CONFIG_PATH.exists() else {}


def mma_plan(n: int, k: int) -> dict | None:
    """The kernel's plan for a weight [n, k] (its own entry, else the table's default), or None if the kernel
    cannot take the shape (n % 16, or K not a multiple of 128 x SPLIT x KSPLIT, KSPLIT 1 when absent)."""
    plan = _plans().get(f"{n}x{k}", _plans().get("default"))
    if plan is None or n % 16 or k % (128 * plan["SPLIT"] * plan.get("KSPLIT", 1)):
        return None
    return plan


def gemv_mma(
    x: torch.Tensor,
    packed: MmaPackedBF16,
    plan: dict,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    raw_from: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [1, K] bf16 (CUDA, contiguous) -> [1, N] bf16: rows below ``raw_from`` (all rows if None) take
    ``rms_norm(x, norm_weight, norm_eps)`` when a norm weight is given, the rest take x as it is."""
    from hyserve.kernels.mma_gemv.cuda_kernel import SPLITS, kernel

    n, k = packed.shape
    split = plan["SPLIT"]
    require(
        x.dim() == 2 and x.shape == (1, k) and x.dtype == torch.bfloat16 and x.is_cuda and x.is_contiguous(),
        f"gemv_mma takes one contiguous bf16 CUDA row of {k}, got {tuple(x.shape)} {x.dtype} on {x.device}",
    )
    require(
        split in SPLITS and k % (128 * split) == 0, f"gemv_mma: SPLIT {split} does not divide K {k} in chunks"
    )
    raw = n if raw_from is None else raw_from
    require(
        raw % 16 == 0 and 0 <= raw <= n, f"gemv_mma: raw_from {raw_from} must be a multiple of 16 in [0, {n}]"
    )
    if norm_weight is not None:
        require(
            norm_weight.shape == (k,) and norm_weight.dtype == torch.bfloat16 and norm_weight.is_contiguous(),
            f"gemv_mma: the norm weight must be bf16 [{k}], got {norm_weight.dtype} {tuple(norm_weight.shape)}",
        )
    if out is None:
        out = torch.empty((1, n), device=x.device, dtype=x.dtype)
    pdl = pdl_enabled(x)
    kernel(x.device, split, norm_weight is not None, pdl).launch(
        n // 16,
        32 * split,
        (out, x, norm_weight, float(norm_eps), raw, packed.low, packed.codes, packed.base, packed.escape_ptr,
         packed.escape_col, packed.escape_delta, k),
        shared_mem=2 * k,
        pdl=pdl,
    )  # fmt: skip
    return out


__all__ = ["MmaPackedBF16", "gemv_mma", "gemv_mma_reference", "mma_plan", "pack_mma", "unpack_mma"]
