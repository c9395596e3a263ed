"""packed_bf16: the 12-bit format gives back every bf16 bit pattern, escapes are rare on weight-like rows."""

from __future__ import annotations

import math

import pytest
import torch

from hyserve.kernels.packed_bf16 import WINDOW, PackedBF16, pack_bf16, unpack_bf16


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@pytest.mark.parametrize("shape", [(1, 2), (7, 48), (300, 512), (64, 4096)])
@pytest.mark.parametrize("scale", [1.0, 2048**-0.5, 1e-30, 3e30])
def test_round_trip_is_bit_exact(shape, scale):
    gen = torch.Generator().manual_seed(shape[0] * shape[1])
    w = (torch.randn(*shape, generator=gen) * scale).bfloat16()
    packed = pack_bf16(w, chunk_rows=5)  # several chunks, one ragged
    assert torch.equal(_bits(unpack_bf16(packed)), _bits(w))


def test_special_values_escape_and_come_back():
    w = (torch.randn(6, 64, generator=torch.Generator().manual_seed(1)) * 0.02).bfloat16()
    specials = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -3e-39, 1e38, 2.0**-133]
    w[0, : len(specials)] = torch.tensor(specials).bfloat16()
    w[1] = 0.0  # a row of zeros: its window holds them all
    w[2, 5] = 1e30  # one huge value in a small row
    packed = pack_bf16(w)
    assert torch.equal(_bits(unpack_bf16(packed)), _bits(w))
    rows = packed.escape_row[: packed.escapes].tolist()
    assert 1 not in rows and rows.count(0) >= len(specials) - 1 and 2 in rows
    ptr = packed.escape_ptr.tolist()
    assert ptr[0] == 0 and ptr[-1] == packed.escapes and all(a <= b for a, b in zip(ptr, ptr[1:]))
    for n in range(w.shape[0]):  # each row's range holds exactly its escapes
        assert rows[ptr[n] : ptr[n + 1]] == [n] * (ptr[n + 1] - ptr[n])


def test_escapes_are_rare_on_gaussian_rows():
    """The dummy weights' distribution (N(0, 1/fan_in)): an element escapes only when it is ~2^-15 below the
    row's bulk, ~1e-4 of them."""
    w = (torch.randn(512, 2048, generator=torch.Generator().manual_seed(2)) * 2048**-0.5).bfloat16()
    packed = pack_bf16(w)
    assert packed.escapes / w.numel() < 3e-4
    assert packed.nbytes / (w.numel() * 2) < 0.76  # 12 bits an element plus a few bytes a row


def test_window_is_where_most_values_are():
    """A row within 2 * WINDOW - 1 binades has no escape, wherever it sits (the window holds 2 * WINDOW
    binades from an even exponent on); the window follows the row's bulk, not its largest value."""
    k = 256
    exps = torch.arange(k) % (2 * WINDOW - 1)  # 15 consecutive binades
    row_a = torch.ldexp(torch.ones(k), exps - 40)
    row_b = torch.ldexp(-torch.ones(k) * 1.5, exps + 20)
    row_c = torch.full((k,), 0.01)
    row_c[0] = 1e20  # one outlier on top: the window stays with the other 255
    packed = pack_bf16(torch.stack([row_a, row_b, row_c]).bfloat16())
    assert packed.escape_row[: packed.escapes].tolist() == [2]


def test_device_move_and_shape():
    packed = pack_bf16(torch.randn(4, 16).bfloat16())
    moved = packed.to("cpu")
    assert isinstance(moved, PackedBF16) and moved.shape == (4, 16) and moved.escapes == packed.escapes


@pytest.mark.parametrize(
    "bad", [torch.randn(4, 16), torch.randn(4, 15).bfloat16(), torch.randn(16).bfloat16()]
)
def test_rejects_what_it_cannot_pack(bad):
    with pytest.raises(ValueError, match="bf16 matrix"):
        pack_bf16(bad)


def test_code_layout():
    """Element 2j's code sits in byte j's low nibble, 2j + 1's in its high nibble: 8 s + (h - base)."""
    w = torch.tensor([[1.0, -1.0, 2.0, -0.5]]).bfloat16()  # h = e >> 1: 63, 63, 64, 63
    packed = pack_bf16(w)
    base = packed.base.item()
    assert base == 64 - (WINDOW - 1) or base <= 63  # the window holds 63 and 64
    codes = [int(b) >> s & 15 for b in packed.nib[0].tolist() for s in (0, 4)]
    h = [63, 63, 64, 63]
    sign = [0, 1, 0, 1]
    assert codes == [8 * s + (hh - base) for s, hh in zip(sign, h)]
    assert packed.low[0].tolist() == [int(v) & 0xFF for v in _bits(w)[0].tolist()]
    assert not math.isnan(unpack_bf16(packed).float().sum().item())
