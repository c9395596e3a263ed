"""L2 prefetch of a weight while the previous kernel of the decode step finishes (Hopper, under PDL).

The MoE router of the batch-1 step is latency-bound (~5 us of a GEMV over 1 MB, a ticket and a top-k) and
leaves HBM idle, while the expert gate_up kernel after it is already resident (``pdl.py``: its programs are
scheduled once the router's programs have passed their wait) and only waits for the expert ids. Its first
programs spend that wait issuing ``prefetch.global.L2`` for the shared expert's weights, which need no ids
(one instruction a 128-byte line, no registers held, no completion to wait for), so those 4.2 MB arrive in
L2 (50 MB on the H200) during the router and the gate_up after the wait reads them from there: the batch-1
step 2051 -> 1999 us (docs/performance.md, 2026-12-04).

A hint only: results are the same with or without it (only caching changes), so the kernel takes it as a plan
option (``L2PF``: how many programs issue it) that the step tuner (``scripts/tune_step.py``) keeps only where
the step gets shorter. Never on the CPU interpreter, which has no inline PTX: the launchers pass 0 there.
The same prefetch in the GEMV (all of W over its first programs, or each first program's own rows, after the
DeltaNet step and the attention) lost or tied in the step on 2026-12-04 and was removed (code at f069c58).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def prefetch_l2(base_ptr, nbytes, part, parts, LINES: tl.constexpr):
    """Prefetch part ``part`` of ``parts`` equal slices of the ``nbytes`` bytes from ``base_ptr`` into L2:
    LINES 128-byte lines a loop step, one prefetch instruction each (spread over the program's threads); a part
    past the end does nothing."""
    step: tl.constexpr = LINES * 128
    chunk = tl.cdiv(tl.cdiv(nbytes, parts), step) * step
    start = chunk.to(tl.int64) * part
    end = tl.minimum(start + chunk, nbytes)
    base = base_ptr.to(tl.pointer_type(tl.int8))
    lines = tl.arange(0, LINES).to(tl.int64) * 128
    for off in range(start, end, step):
        o = tl.minimum(off + lines, nbytes - 1)  # the last lines repeat: a repeated prefetch is free
        tl.inline_asm_elementwise(
            "mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];",
            "=r,l",
            [base + o],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


def prefetch_parts(cfg: dict, use_pdl: bool) -> int:
    """The plan's ``L2PF`` (programs that prefetch), 0 without PDL (nothing to overlap; the interpreter)."""
    return int(cfg.get("L2PF", 0)) if use_pdl else 0
