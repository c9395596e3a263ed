"""Words copied by a kernel, either side in device or pinned host memory (``copy_words``).

Grid (cdiv(S, BLOCK),): program p copies words [p * BLOCK, (p + 1) * BLOCK) of src, or of overlay for the words
below its length, so that every destination word is written once (no ordering between programs needed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


# Not specialised on the counts (Triton would build a variant for 1, for multiples of 16 and for the rest): one
# build serves every step's staging, overlay and read-back, and the start-up's warm-up steps make it, so a
# first request never waits for a compile
@triton.jit(do_not_specialize=["n_words", "n_overlay"])
def _copy_words_kernel(src_ptr, dst_ptr, overlay_ptr, n_words, n_overlay, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    from_overlay = offs < n_overlay
    w = tl.load(src_ptr + offs, mask=(offs < n_words) & ~from_overlay, other=0)
    w = tl.where(from_overlay, tl.load(overlay_ptr + offs, mask=from_overlay, other=0), w)
    tl.store(dst_ptr + offs, w, mask=offs < n_words)


def copy_words_triton(src: torch.Tensor, dst: torch.Tensor, overlay: torch.Tensor | None = None) -> None:
    """src [S], dst [>= S], overlay [M <= S] int32 words (``copy_words``' checks done): dst[:S] = src with its
    first M words replaced by overlay's."""
    n = src.numel()
    if n == 0:
        return
    over = overlay if overlay is not None else src
    _copy_words_kernel[(triton.cdiv(n, BLOCK),)](
        src, dst, over, n, 0 if overlay is None else overlay.numel(), BLOCK=BLOCK, num_warps=4
    )
