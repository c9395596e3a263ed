"""The 12-bit format (``kernels/packed_bf16``) laid out in the order of ``mma.m16n8k16``'s A fragment.

A CTA of the kernel multiplies a tile of 16 rows. At each k16 step, lane l (g = l // 4, t = l % 4) of a warp
holds eight weights of the tile in its four A registers: element j (0..7) at row ``g + 8 ((j >> 1) & 1)`` and
column ``2t + (j & 1) + 8 (j >> 2)`` (``FRAG_ROW``, ``FRAG_COL``; the PTX ISA's fragment layout for bf16). The
packed copy stores exactly those eight elements of a (tile, step, lane) together, so a thread's loads are whole
16-byte words and no weight moves between threads:

- ``low`` uint8 [T, S/2, 32, 16]: the eight low bytes of steps 2p and 2p + 1 (one 16-byte load, two steps);
- ``codes`` int32 [T, S/4, 32, 4]: one word a step (one 16-byte load, four steps); byte j of the word holds
  element j's 4-bit code in its low nibble and element j + 4's in its high nibble, so ``w & 0x0F0F0F0F`` and
  ``(w >> 4) & 0x0F0F0F0F`` are the codes of elements 0-3 and 4-7, one per byte;
- ``base`` int32 [N]: each row's window (``packed_bf16``), and the escapes as row pointers, columns and
  ``delta = w - v'`` in fp32 (the true value less what its stored bits decode to), so a kernel adds
  ``delta * x`` without decoding anything. ``w - v'`` is exact unless the two lie more than 24 binades apart
  (a zero, or a value far below its row's bulk), and then the product's error is below 2^-24 of ``v' x``: the
  fp32 rounding any order of the sum has. The true values are kept too, for ``unpack_mma`` (bit-exact).

Decoding four elements is then byte-parallel integer arithmetic: high bytes ``((c & 7) + base) | (c & 8) << 4``
for the four codes c at once (bases <= 120, so no byte carries into the next), and two ``prmt`` interleave them
with the low bytes into two bf16 pairs, which are the A registers. ``emulate_decode`` does exactly the kernel's
indexing and integer operations in torch, so the CPU tests check the layout the GPU kernel reads.

T = N / 16 tiles, S = K / 16 steps; N must be a multiple of 16 and K of 64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hyserve.kernels.packed_bf16 import decoded_bits, pack_bf16

_J = torch.arange(8)
_L = torch.arange(32)
FRAG_ROW = (_L[:, None] >> 2) + 8 * ((_J[None, :] >> 1) & 1)  # [32, 8]: row in the tile of lane l's element j
FRAG_COL = 2 * (_L[:, None] & 3) + (_J[None, :] & 1) + 8 * (_J[None, :] >> 2)  # [32, 8]: column in the step


@dataclass(frozen=True)
class MmaPackedBF16:
    """A bf16 matrix [N, K] in the 12-bit format, fragment-ordered for ``gemv_mma`` (the module says how)."""

    low: torch.Tensor  # [N/16, K/32, 32, 16] uint8
    codes: torch.Tensor  # [N/16, K/64, 32, 4] int32
    base: torch.Tensor  # [N] int32
    escape_ptr: torch.Tensor  # [N + 1] int32: row n's escapes are entries escape_ptr[n] .. escape_ptr[n + 1]
    escape_col: torch.Tensor  # [P + 1] int32 (a last entry of zeros, so that no list is empty)
    escape_delta: torch.Tensor  # [P + 1] fp32: w - v', the true value less the stored bits' value
    escape_val: torch.Tensor  # [P + 1] fp32: w, the true value (for ``unpack_mma``; the kernel reads delta)

    @property
    def shape(self) -> tuple[int, int]:
        return self.base.shape[0], self.low.shape[1] * 32

    @property
    def escapes(self) -> int:
        return self.escape_col.numel() - 1

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.__dict__.values())


def to_fragments(m: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [N/16, K/16, 32, 8]: element j of lane l at (tile, step) is m[16 tile + FRAG_ROW, 16 step + FRAG_COL]."""
    n, k = m.shape
    tiles = m.reshape(n // 16, 16, k // 16, 16).permute(0, 2, 1, 3)  # [T, S, 16, 16]
    return tiles[:, :, FRAG_ROW.to(m.device), FRAG_COL.to(m.device)]


def from_fragments(f: torch.Tensor) -> torch.Tensor:
    """The inverse of ``to_fragments``."""
    t, s = f.shape[:2]
    out = torch.empty(t, s, 16, 16, dtype=f.dtype, device=f.device)
    out[:, :, FRAG_ROW.to(f.device), FRAG_COL.to(f.device)] = f
    return out.permute(0, 2, 1, 3).reshape(t * 16, s * 16)


def _bf16_from_bits(bits: torch.Tensor) -> torch.Tensor:
    return ((bits ^ 0x8000) - 0x8000).to(torch.int16).view(torch.bfloat16)


@torch.no_grad()
def pack_mma(weight: torch.Tensor) -> MmaPackedBF16:
    """weight [N, K] bf16 (N % 16 == 0, K % 64 == 0) -> its fragment-ordered 12-bit copy on the same device."""
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    if weight.dtype != torch.bfloat16 or weight.dim() != 2 or n % 16 or k % 64 or n == 0:
        raise ValueError(
            f"pack_mma takes a bf16 matrix [N, K] with N a multiple of 16 and K of 64, got {weight.dtype} "
            f"{tuple(weight.shape)}"
        )
    p = pack_bf16(weight)
    tiles, steps = n // 16, k // 16
    code = torch.stack((p.nib & 15, p.nib >> 4), dim=2).flatten(1)  # [N, K] uint8 (few temporaries: at load)
    low = to_fragments(p.low).reshape(tiles, steps // 2, 2, 32, 8).permute(0, 1, 3, 2, 4)
    cf = to_fragments(code)
    words = (cf[..., :4] | (cf[..., 4:] << 4)).contiguous().view(torch.int32)[..., 0]
    e = p.escapes
    rows, cols = p.escape_row[:e].long(), p.escape_col[:e].long()
    stored = _bf16_from_bits(
        decoded_bits(p.low[rows, cols].long(), code[rows, cols].long(), p.base[rows].long())
    )
    return MmaPackedBF16(
        low=low.reshape(tiles, steps // 2, 32, 16).contiguous(),
        codes=words.reshape(tiles, steps // 4, 4, 32).permute(0, 1, 3, 2).contiguous(),
        base=p.base.contiguous(),
        escape_ptr=p.escape_ptr.contiguous(),
        escape_col=p.escape_col.contiguous(),
        escape_delta=torch.cat((p.escape_val[:e] - stored.float(), p.escape_val[e:])).contiguous(),
        escape_val=p.escape_val.contiguous(),
    )


def _u32(b: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 4] -> int64 [...]: the little-endian 32-bit word."""
    b = b.to(torch.int64)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def _prmt(a: torch.Tensor, b: torch.Tensor, sel: int) -> torch.Tensor:
    """PTX ``prmt.b32`` (default mode) on int64 words: byte i of the result is byte ``(sel >> 4i) & 7`` of {b, a}."""
    out = torch.zeros_like(a)
    for i in range(4):
        s = (sel >> (4 * i)) & 7
        out |= (((a if s < 4 else b) >> (8 * (s & 3))) & 0xFF) << (8 * i)
    return out


@torch.no_grad()
def emulate_decode(packed: MmaPackedBF16, t0: int = 0, t1: int | None = None) -> torch.Tensor:
    """The A registers the kernel's threads build, by its own indexing of the flat buffers and its integer
    operations, put back as the bf16 matrix [N, K] (escapes not yet corrected); with ``t0`` / ``t1`` only the rows
    of tiles t0 .. t1 - 1 ([16 (t1 - t0), K]: the int64 temporaries are ~64 bytes an element)."""
    n, k = packed.shape
    tiles, steps = n // 16, k // 16
    dev = packed.low.device
    tt, ss, ll = torch.meshgrid(
        torch.arange(t0, tiles if t1 is None else t1, device=dev),
        torch.arange(steps, device=dev),
        torch.arange(32, device=dev),
        indexing="ij",
    )
    lb = packed.low.reshape(-1, 16)[(tt * (steps // 2) + ss // 2) * 32 + ll]  # the thread's 16-byte load
    lb = torch.gather(lb, 3, ((ss % 2)[..., None] * 8 + torch.arange(8, device=dev)).expand(*lb.shape[:3], 8))
    l0, l1 = _u32(lb[..., :4]), _u32(lb[..., 4:])
    w = packed.codes.reshape(-1, 4)[(tt * (steps // 4) + ss // 4) * 32 + ll]
    w = torch.gather(w, 3, (ss % 4)[..., None]).squeeze(-1).to(torch.int64) & 0xFFFFFFFF
    base = packed.base.to(torch.int64)
    bg, bg8 = base[tt * 16 + (ll >> 2)], base[tt * 16 + (ll >> 2) + 8]
    base4 = bg | (bg << 8) | (bg8 << 16) | (bg8 << 24)
    ca, cb = w & 0x0F0F0F0F, (w >> 4) & 0x0F0F0F0F
    ha = ((ca & 0x07070707) + base4) | ((ca << 4) & 0x80808080)
    hb = ((cb & 0x07070707) + base4) | ((cb << 4) & 0x80808080)
    regs = (_prmt(l0, ha, 0x5140), _prmt(l0, ha, 0x7362), _prmt(l1, hb, 0x5140), _prmt(l1, hb, 0x7362))
    bits = torch.stack([h for r in regs for h in (r & 0xFFFF, r >> 16)], dim=-1)  # element j: register j // 2
    return from_fragments(_bf16_from_bits(bits))


def escape_rows(packed: MmaPackedBF16) -> torch.Tensor:
    """[P] int64: the row of each escape."""
    ptr = packed.escape_ptr.long()
    return torch.repeat_interleave(torch.arange(ptr.numel() - 1, device=ptr.device), ptr[1:] - ptr[:-1])


@torch.no_grad()
def unpack_mma(packed: MmaPackedBF16, elements_at_once: int = 1 << 25) -> torch.Tensor:
    """The exact bf16 matrix [N, K] back: the decode, with each escape's true value written back. The decode runs
    over tiles of about ``elements_at_once`` weights at a time (~2 GB of temporaries at the default), so that the
    experts of a whole layer (~539M weights) unpack beside a model that fills most of the GPU (``hyserve verify``)."""
    n, k = packed.shape
    w = torch.empty((n, k), dtype=torch.bfloat16, device=packed.low.device)
    step = max(1, elements_at_once // (16 * k))
    for t0 in range(0, n // 16, step):
        t1 = min(n // 16, t0 + step)
        w[16 * t0 : 16 * t1] = emulate_decode(packed, t0, t1)
    e = packed.escapes
    w[escape_rows(packed), packed.escape_col[:e].long()] = packed.escape_val[:e].to(torch.bfloat16)
    return w
