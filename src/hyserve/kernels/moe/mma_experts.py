"""The experts' fragment-ordered 12-bit copies (``--mma-experts``; ``layers/mma_projections.py`` makes them), which
the expert kernels stream on tensor cores.

Layout (``pack_mma_experts``): each expert's [2I, H] gate_up rows reordered so that every 16-row tile holds 8
gate rows and the 8 up rows of the same intermediate indices (rows ``8j .. 8j+7`` of gate, then of up), so that a
thread's C registers hold a gate value and its up value; the shared expert appended as expert E, and the whole
[(E + 1) 2I, H] matrix packed by ``mma_gemv.pack_mma``. The down weights [E, H, I] likewise, rows in order, the
shared expert last. Both round-trip bit-exactly (``unpack_mma_experts``, ``unpack_mma_down``).

Their kernels: ``mma_grouped.py`` (prefills and batched decode) and ``mma_pairs.py`` (one token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hyserve.kernels.mma_gemv import MmaPackedBF16, pack_mma, unpack_mma


@dataclass(frozen=True)
class MmaExperts:
    """A MoE block's gate_up and down weights (routed experts, then the shared expert as expert E), fragment-ordered."""

    gate_up: MmaPackedBF16  # [(E + 1) 2I, H], each expert's rows in tiles of 8 gate + 8 up rows
    num_experts: int  # E (the shared expert is E)
    inter: int  # I
    down: MmaPackedBF16 | None = (
        None  # [(E + 1) H, I]: the experts' down rows in order, the shared expert last
    )
    # the block's bf16 routed experts were released (``--mma-experts-only``): every expert kernel must take this copy
    released: bool = False

    @property
    def nbytes(self) -> int:
        return self.gate_up.nbytes + (self.down.nbytes if self.down is not None else 0)


def _tile_order(inter: int) -> torch.Tensor:
    """[2I] row permutation of one expert's gate_up: tile j holds gate rows 8j..8j+7, then up rows 8j..8j+7."""
    j = torch.arange(inter // 8)[:, None]
    r = torch.arange(8)[None, :]
    return torch.cat([8 * j + r, inter + 8 * j + r], dim=1).flatten()


@torch.no_grad()
def pack_mma_experts(
    w_gate_up: torch.Tensor,
    shared_gate_up: torch.Tensor,
    w_down: torch.Tensor | None = None,
    shared_down: torch.Tensor | None = None,
) -> MmaExperts:
    """w_gate_up [E, 2I, H], shared_gate_up [2I, H] (bf16, I % 8 == 0, H % 64 == 0) and optionally w_down [E, H,
    I], shared_down [H, I] (I % 64 == 0) -> their copy."""
    e, two_i, hidden = w_gate_up.shape
    if shared_gate_up.shape != (two_i, hidden) or two_i % 16 or w_gate_up.dtype != torch.bfloat16:
        raise ValueError(
            f"pack_mma_experts takes bf16 experts [E, 2I, H] with I % 8 == 0 and a shared expert [2I, H], got "
            f"{w_gate_up.dtype} {tuple(w_gate_up.shape)} and {tuple(shared_gate_up.shape)}"
        )
    down = None
    if w_down is not None:
        if (
            w_down.shape != (e, hidden, two_i // 2)
            or shared_down is None
            or shared_down.shape != w_down.shape[1:]
        ):
            raise ValueError(
                f"pack_mma_experts: the down weights must be [E, H, I] = {(e, hidden, two_i // 2)} with a shared "
                f"expert [H, I], got {tuple(w_down.shape)} and {None if shared_down is None else tuple(shared_down.shape)}"
            )
        down = pack_mma(torch.cat([w_down.reshape(-1, two_i // 2), shared_down]))
    order = _tile_order(two_i // 2).to(w_gate_up.device)
    stacked = torch.cat([w_gate_up[:, order], shared_gate_up[order][None]]).reshape(-1, hidden)
    return MmaExperts(gate_up=pack_mma(stacked), num_experts=e, inter=two_i // 2, down=down)


def shape_only(t: torch.Tensor) -> torch.Tensor:
    """t's shape, dtype and device over one element (stride 0): what is left of a weight whose copy replaced it
    (``MmaExperts.released``)."""
    return torch.zeros((), dtype=t.dtype, device=t.device).expand(t.shape)


def unpack_mma_experts(packed: MmaExperts) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 (w_gate_up [E, 2I, H], shared_gate_up [2I, H]) back."""
    w = unpack_mma(packed.gate_up).reshape(packed.num_experts + 1, 2 * packed.inter, -1)
    inverse = torch.argsort(_tile_order(packed.inter)).to(w.device)
    w = w[:, inverse]
    return w[:-1], w[-1]


def unpack_mma_down(packed: MmaExperts) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 (w_down [E, H, I], shared_down [H, I]) back."""
    w = unpack_mma(packed.down).reshape(packed.num_experts + 1, -1, packed.inter)
    return w[:-1], w[-1]
