"""A bf16 matrix in 12 bits an element, losslessly: the weight stream of a memory-bound GEMV shrinks by a quarter.

A bf16 value is 16 bits, [s | e7..e0 | m6..m0]. Its low byte ``[e0 | m6..m0]`` is kept as it is. Its high byte
``[s | e7..e1]`` is nearly constant along a row of a trained (or Gaussian) weight matrix: the exponents of a
row's values fall within a few binades of each other. So each row n keeps a window ``base_n .. base_n + 7`` of
``h = e >> 1`` (16 binades of exponent), and each element stores a 4-bit code ``c = 8 s + (h - base_n)``:

    high byte = (c & 7) + base_n + 128 (c >> 3)        fp32 bits = high << 24 | low << 16

Decoding is a few integer operations and a bitcast, with no table. The window is the one that holds the most
values of the row (16 binades from an even exponent on: any 15 consecutive ones), so an element outside it (an *escape*: a value 2^-15 below the row's bulk, an exact zero, a
NaN) is rare: ~1e-4 of a Gaussian row (``test_packed_bf16.py``), and published measurements of fixed-rate
12-bit formats of this kind find 0.03-0.05% on trained LLM weights. An escape is stored with the code of the
window's first h and its own sign and low byte, so it decodes to a wrong but finite value ``v'``; its true value
``w`` is kept in a short list sorted by row, and a kernel adds ``(w - v') x`` for each. The sum is then exactly
``sum w x`` up to the fp32 rounding that any reordering of the sum has (``w - v'`` is exact unless the two are
more than 16 binades apart, and then its rounding is below 2^-24 of the larger).

Storage: ``low`` [N, K] uint8 and ``nib`` [N, K/2] uint8 (element 2j's code in byte j's low nibble, 2j+1's in
its high nibble, so a tile of K-contiguous elements loads as contiguous bytes and ``tl.interleave`` restores
the order), ``base`` [N] int32 and the escapes (row, col, value): 0.75 of the bf16 bytes, plus 8 bytes a row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WINDOW = 8  # values of h = e >> 1 that a row's 3-bit offset covers: 16 binades of exponent


@dataclass(frozen=True)
class PackedBF16:
    """A bf16 matrix [N, K] (K even) in the 12-bit format of this module; the same device for every field."""

    low: torch.Tensor  # [N, K] uint8: each element's low byte [e0 | m6..m0]
    nib: torch.Tensor  # [N, K // 2] uint8: codes 8 s + (h - base), element 2j low nibble, 2j + 1 high
    base: torch.Tensor  # [N] int32: the row's window of h = e >> 1, base .. base + 7 (base <= 120)
    escape_ptr: torch.Tensor  # [N + 1] int32: row n's escapes are entries escape_ptr[n] .. escape_ptr[n + 1]
    escape_row: torch.Tensor  # [P + 1] int32: the row of each escape (sorted)
    escape_col: torch.Tensor  # [P + 1] int32: its column
    escape_val: torch.Tensor  # [P + 1] fp32: its true value (a bf16 value, exact in fp32)
    # (each list ends with an entry of zeros that no row's range holds, so that none is ever empty: a
    # kernel's pointer argument must point at memory even when it loads nothing)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.low.shape)

    @property
    def nbytes(self) -> int:
        """Bytes a full read moves (every field)."""
        return sum(t.numel() * t.element_size() for t in self.__dict__.values())

    @property
    def operands(self) -> tuple[torch.Tensor, ...]:
        """The kernels' operands, in the order their signatures take them: low, nib, base, and the escapes'
        ptr, row, col, val."""
        return (
            self.low,
            self.nib,
            self.base,
            self.escape_ptr,
            self.escape_row,
            self.escape_col,
            self.escape_val,
        )

    @property
    def escapes(self) -> int:
        return self.escape_row.numel() - 1

    def to(self, device: torch.device | str) -> PackedBF16:
        return PackedBF16(**{k: v.to(device) for k, v in self.__dict__.items()})


def _row_windows(h: torch.Tensor) -> torch.Tensor:
    """h [R, K] int64 in [0, 127] -> base [R]: the start of the WINDOW consecutive values holding the most of
    each row (the highest such start on a tie, keeping a row's largest values exact)."""
    rows = h.shape[0]
    counts = torch.zeros(rows, 128, dtype=torch.int32, device=h.device)
    counts.scatter_add_(1, h, torch.ones_like(h, dtype=torch.int32))
    csum = torch.nn.functional.pad(counts.cumsum(1), (1, 0))
    held = csum[:, WINDOW:] - csum[:, :-WINDOW]  # [R, 121]: values in window base .. base + 7
    starts = torch.arange(held.shape[1], device=h.device)
    score = held.to(torch.int64) * 256 + starts  # ties go to the highest start
    return score.argmax(1)


@torch.no_grad()
def pack_bf16(weight: torch.Tensor, chunk_rows: int | None = None) -> PackedBF16:
    """weight [N, K] bf16 (K even) -> its ``PackedBF16`` on the same device, in chunks of rows (default: 32 M
    elements, ~1.5 GB of temporaries) so that packing a multi-GB weight needs little memory beside it."""
    if weight.dtype != torch.bfloat16 or weight.dim() != 2 or weight.shape[1] % 2:
        raise ValueError(
            f"pack_bf16 takes a 2-D bf16 matrix with an even row length, got {weight.dtype} "
            f"{tuple(weight.shape)}"
        )
    n, k = weight.shape
    dev = weight.device
    chunk_rows = chunk_rows or max(1, (1 << 25) // k)
    low = torch.empty(n, k, dtype=torch.uint8, device=dev)
    nib = torch.empty(n, k // 2, dtype=torch.uint8, device=dev)
    base = torch.empty(n, dtype=torch.int32, device=dev)
    counts = torch.empty(n, dtype=torch.int64, device=dev)
    rows, cols, vals = [], [], []
    for r0 in range(0, n, chunk_rows):
        w = weight[r0 : r0 + chunk_rows].contiguous()
        bits = w.view(torch.int16).to(torch.int64) & 0xFFFF
        hi = bits >> 8
        sign, h = hi >> 7, hi & 0x7F
        b = _row_windows(h)
        d = h - b[:, None]
        inside = (d >= 0) & (d < WINDOW)
        code = sign * 8 + torch.where(inside, d, 0)
        low[r0 : r0 + chunk_rows] = (bits & 0xFF).to(torch.uint8)
        nib[r0 : r0 + chunk_rows] = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
        base[r0 : r0 + chunk_rows] = b.to(torch.int32)
        counts[r0 : r0 + chunk_rows] = (~inside).sum(1)
        r, c = (~inside).nonzero(as_tuple=True)
        rows.append((r + r0).to(torch.int32))
        cols.append(c.to(torch.int32))
        vals.append(w[r, c].float())
    rows.append(torch.zeros(1, dtype=torch.int32, device=dev))
    cols.append(torch.zeros(1, dtype=torch.int32, device=dev))
    vals.append(torch.zeros(1, dtype=torch.float32, device=dev))
    ptr = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    ptr[1:] = counts.cumsum(0)
    return PackedBF16(
        low=low,
        nib=nib,
        base=base,
        escape_ptr=ptr.to(torch.int32),
        escape_row=torch.cat(rows),
        escape_col=torch.cat(cols),
        escape_val=torch.cat(vals),
    )


def decoded_bits(low: torch.Tensor, code: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """The format's decode, elementwise (int64 tensors broadcasting together): the bf16 bit pattern
    ``(high << 8) | low`` with ``high = (code & 7) + base + 128 (code >> 3)``."""
    return (((code & 7) + base + ((code >> 3) << 7)) << 8) | low


@torch.no_grad()
def unpack_bf16(packed: PackedBF16) -> torch.Tensor:
    """The exact bf16 matrix [N, K] back (the reference every kernel reading the format is checked against)."""
    nib = packed.nib.to(torch.int64)
    code = torch.stack((nib & 15, nib >> 4), dim=2).flatten(1)
    bits = decoded_bits(packed.low.to(torch.int64), code, packed.base.to(torch.int64)[:, None])
    out = ((bits ^ 0x8000) - 0x8000).to(torch.int16).view(torch.bfloat16)
    p = packed.escapes
    out[packed.escape_row[:p].long(), packed.escape_col[:p].long()] = packed.escape_val[:p].to(torch.bfloat16)
    return out
