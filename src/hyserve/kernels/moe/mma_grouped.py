"""The grouped MoE gate_up and down (prefill and batched decode) over the experts' fragment-ordered 12-bit copies,
on tensor cores: the contracts of ``triton_gate_up.gate_up`` and of ``triton_prefill``'s down kernel (y by pair,
for ``sum_rows``), with 0.75 of their weight bytes.

``gate_up_grouped_mma`` takes the routing's blocks (``routing.py``: block b is up to BLOCK_M routing rows of
one expert; rows < N are pairs in expert order, row N + t token t of the shared expert) and writes ``h [N + T,
I]``: ``h[r] = w_r silu(x[t_r] W_g[e_r]^T) (x[t_r] W_u[e_r]^T)``, w_r the pair's routing weight or, for the
shared expert, ``sigmoid(x[t] . shared_expert_gate)``. x is the block's input after its pre-norm (bf16).

The packed matrix is ``mma_experts.pack_mma_experts``' (each expert's gate_up rows in 16-row tiles of 8 gate rows
and the 8 up rows of the same intermediate indices; the shared expert as expert E). A CTA takes WARPS x RT tiles
of one block; warp w streams its RT consecutive tiles over all of K, decoding each k16 step's weights straight
into ``mma.m16n8k16``'s A registers (as ``kernels/mma_gemv`` does) and using them for every 8-token column
group of the block: the tokens are the B operand (one ``ldmatrix`` of B feeds RT mma's). The block's gathered x rows pass through shared memory in
chunks of 128 columns (``cp.async``, three buffers, one barrier a chunk), read by ``ldmatrix``. A thread's C
registers hold gate row g and up row g of the same tokens, so the SwiGLU and the weight are applied in
registers. Escapes (values outside a row's 12-bit window) add ``delta * x[t, col]`` before the SwiGLU.

``down_grouped_mma`` is the same kernel over the down weights' copy (each expert's [H, I] rows in order, the shared
expert last: 16 output columns a tile), with h's rows of the block as the B operand (contiguous, no gather) and
each result written to the row of its pair.

The grid is (rows of an expert / 16 / (WARPS RT), MAXB): blocks past the routing's block count exit at once
(CUDA-graph safe), and the CTAs of one block are adjacent, so its x rows are read from HBM once.

``grouped_wgmma`` has the same contract on ``wgmma.mma_async``: a warpgroup's four decoded tiles are the A operand
(registers) of one m64nNk16 a k16 step, N the block's tokens rounded up to 16 (an instance each, chosen at run
time), the tokens read by the tensor cores from the chunk buffers in the K-major 128-byte swizzle; a warp's weights
stream into registers DEPTH chunks ahead, and L2 is asked for the ``L2_AHEAD`` chunks after those (a bulk prefetch a
chunk: more bytes in flight without registers). The accumulators have the mma.sync layout, so both kernels share the
gate, escapes and stores (the CUDA source: ``mma_grouped_cuda.py``). (Staging the weights through shared
memory too, and a warp-specialized form with a producer warp and mbarriers, were slower on the H100:
docs/performance.md, 2026-12-06.)

Where they win: ``PLANS`` (the H100 rows of docs/performance.md, 2026-12-06).
"""

from __future__ import annotations

import ctypes

import torch

from hyserve.kernels.contracts import require
from hyserve.kernels.mma_gemv import MmaPackedBF16
from hyserve.kernels.moe.mma_experts import MmaExperts, unpack_mma_down, unpack_mma_experts
from hyserve.kernels.moe.mma_grouped_cuda import SOURCE
from hyserve.kernels.nvrtc import template_kernel
from hyserve.kernels.pdl import enabled as pdl_enabled

CHUNK_K = 128  # x columns a shared-memory chunk holds (8 k16 steps: one weight chunk of a thread)
BLOCK_MS = (16, 32, 64, 128)  # the routing's BLOCK_M values the kernel is built for (8-token column groups)
# (WARPS a CTA, RT 16-row tiles a warp, DEPTH: 0 for grouped_mma, else grouped_wgmma with DEPTH weight chunks
# ahead) by BLOCK_M where the kernels beat the Triton plans (``tiles=`` overrides: bench, tests). H100, 2026-12-06,
# 0dbf2b0 (``bench --mma-grouped``), us, Triton / mma.sync 4w / wgmma 4w d1 / 8w d1 / 8w d2: gate_up at 512 tokens
# (BLOCK_M 32) 384 / 310 / 303 / 307 / 378, at 1024 (64) 397 / 430 / 342 / 328 / 412; down+sum 215 / 194 / 191 / 194
# / 259, 230 / 275 / 223 / 222 / 300. Not at BLOCK_M 128 (from ~2048 tokens): gate_up 411 against 492 (fb5af49);
# nor those prompts routed at 64 instead (2026-12-06, ef9650e: first token at 2048 / 4096 tokens 17.83 / 30.16 ms
# against 17.64 / 26.50 with the Triton kernels at 128, 16 layers)
PLANS = {16: (4, 1, 0), 32: (4, 1, 1), 64: (8, 1, 1)}
UNPLANNED_TILES = (8, 1, 0)  # a direct call at another BLOCK_M (tests, bench)
# weight chunks a wgmma warp asks L2 for past its register ring. H100, 2026-12-07 (scripts/device/grouped_anatomy.sh),
# us at 512 / 1024 tokens with the plans' tiles, 0 / 1 / 2 / 4 ahead: gate_up 302.4 / 300.4 / 303.2 / 346.6 and
# 327.7 / 323.0 / 335.6 / 398.9, down+sum 190.7 / 186.2 / 194.7 / 200.5 and 221.9 / 216.1 / 222.8 / 235.5
L2_AHEAD = 1
Tiles = tuple[int, int, int]


def grouped_mma_takes(packed: MmaExperts, block_m: int, hidden: int) -> bool:
    """Whether the grouped kernels take these experts at this routing block size (with its plan's tiles)."""
    if block_m not in PLANS or hidden % CHUNK_K or packed.inter % CHUNK_K:
        return False
    warps, rt, _ = PLANS[block_m]
    return (2 * packed.inter // 16) % (warps * rt) == 0 and (hidden // 16) % (warps * rt) == 0


def gate_up_grouped_reference(
    x: torch.Tensor,
    packed: MmaExperts,
    shared_expert_gate: torch.Tensor | None,
    topk_weights: torch.Tensor,
    sorted_pairs: torch.Tensor,
    meta: torch.Tensor,
    max_blocks: int,
) -> torch.Tensor:
    """x [T, H] (normed), the routing's topk_weights [T, k] fp32, sorted_pairs [N] and meta [3 MAXB + 1] ->
    h [N + T, I] in x's dtype (the contract of ``gate_up_grouped_mma``), in fp32 from the unpacked weights."""
    w, shared = unpack_mma_experts(packed)
    T, k_top = topk_weights.shape
    n, inter, e_shared = T * k_top, packed.inter, packed.num_experts
    h = torch.zeros(n + T, inter, dtype=x.dtype, device=x.device)
    meta_h, pairs = meta.tolist(), sorted_pairs.long()
    for b in range(meta_h[3 * max_blocks]):
        e, row0, cnt = meta_h[b], meta_h[max_blocks + b], meta_h[2 * max_blocks + b]
        rows = torch.arange(row0, row0 + cnt, device=x.device)
        if e == e_shared:
            tok, mat = rows - n, shared
            xs = x[tok].float()
            if shared_expert_gate is not None:
                wr = torch.sigmoid(xs @ shared_expert_gate.float().reshape(-1))
            else:
                wr = torch.ones(cnt, device=x.device)
        else:
            pair = pairs[rows]
            tok, mat = pair // k_top, w[e]
            xs = x[tok].float()
            wr = topk_weights.reshape(-1)[pair].float()
        gu = xs @ mat.float().T  # [cnt, 2I]
        g, u = gu[:, :inter], gu[:, inter:]
        h[rows] = (g / (1.0 + torch.exp(-g)) * u * wr[:, None]).to(x.dtype)
    return h


def down_grouped_reference(
    h: torch.Tensor,
    packed: MmaExperts,
    topk_weights: torch.Tensor,
    sorted_pairs: torch.Tensor,
    meta: torch.Tensor,
    max_blocks: int,
) -> torch.Tensor:
    """h [N + T, I] by routing row -> y [N + T, H] in h's dtype by pair (row t k + j: token t's slot j; row N + t
    its shared expert's), ``h[r] W_down[e_r]^T`` in fp32 from the unpacked weights (``down_grouped_mma``'s
    contract)."""
    w, shared = unpack_mma_down(packed)
    y = torch.zeros(h.shape[0], w.shape[1], dtype=h.dtype, device=h.device)
    meta_h = meta.tolist()
    for b in range(meta_h[3 * max_blocks]):
        e, row0, cnt = meta_h[b], meta_h[max_blocks + b], meta_h[2 * max_blocks + b]
        rows = torch.arange(row0, row0 + cnt, device=h.device)
        mat = shared if e == packed.num_experts else w[e]
        dst = rows if e == packed.num_experts else sorted_pairs.long()[rows]
        y[dst] = (h[rows].float() @ mat.float().T).to(h.dtype)
    return y


_P, _I = ctypes.c_void_p, ctypes.c_int
_PARAMS = (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I)


def _launch(
    out: torch.Tensor,
    x: torch.Tensor,
    sg: torch.Tensor | None,
    topk_weights: torch.Tensor,
    sorted_pairs: torch.Tensor,
    meta: torch.Tensor,
    max_blocks: int,
    block_m: int,
    p: MmaPackedBF16,
    rows: int,
    tiles: Tiles | None,
    down: bool,
    n_experts: int,
) -> torch.Tensor:
    """The grouped kernel over the packed matrix p (``rows`` packed rows an expert) into out; ``tiles`` (WARPS, RT,
    DEPTH), else the plan's for block_m."""
    warps, rt, depth = tiles or PLANS.get(block_m, UNPLANNED_TILES)
    k_top, K = topk_weights.shape[1], x.shape[1]
    require(
        block_m in BLOCK_MS and K % CHUNK_K == 0 and (rows // 16) % (warps * rt) == 0,
        f"the grouped mma kernels take BLOCK_M in {BLOCK_MS} (got {block_m}), K a multiple of {CHUNK_K} (got {K}) "
        f"and an expert's {rows // 16} 16-row tiles a multiple of WARPS x RT = {warps} x {rt}",
    )
    require(
        depth in (0, 1, 2) and (depth == 0 or (rt == 1 and warps % 4 == 0)),
        f"wgmma tiles are warpgroups of one 16-row tile a warp, one or two chunks ahead (got {warps} warps x {rt}, "
        f"depth {depth})",
    )
    pdl = pdl_enabled(x)
    if depth:  # three x chunk buffers in the swizzle, from a 1024-byte boundary
        smem = 3 * block_m * CHUNK_K * 2 + 1024
        name, targs = "grouped_wgmma", (block_m // 8, warps, depth, L2_AHEAD, down, pdl)
    else:
        smem = 3 * block_m * (CHUNK_K + 8) * 2
        name, targs = "grouped_mma", (block_m // 8, warps, rt, down, pdl)
    template_kernel(SOURCE, name, targs, _PARAMS, x.device).launch(
        (rows // 16 // (warps * rt), max_blocks),
        32 * warps,
        (out, x, sg, topk_weights, sorted_pairs, meta, p.low, p.codes, p.base, p.escape_ptr, p.escape_col,
         p.escape_delta, topk_weights.numel(), K, rows, out.shape[1], n_experts, max_blocks, k_top),
        shared_mem=smem,
        pdl=pdl,
    )  # fmt: skip
    return out


def gate_up_grouped_mma(
    x: torch.Tensor,
    packed: MmaExperts,
    shared_expert_gate: torch.Tensor | None,
    topk_weights: torch.Tensor,
    sorted_pairs: torch.Tensor,
    meta: torch.Tensor,
    max_blocks: int,
    block_m: int,
    tiles: Tiles | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """See ``gate_up_grouped_reference``: x [T, H] bf16 CUDA (normed) -> h [N + T, I] bf16 (into ``out``)."""
    T, H = x.shape
    k_top = topk_weights.shape[1]
    require(
        x.dtype == torch.bfloat16 and x.is_cuda and x.is_contiguous() and packed.gate_up.shape[1] == H
        and topk_weights.dtype == torch.float32 and topk_weights.is_contiguous(),
        "gate_up_grouped_mma takes contiguous bf16 x [T, H] (H the experts' K) and fp32 routing weights",
    )  # fmt: skip
    sg = None
    if shared_expert_gate is not None:
        sg = shared_expert_gate.reshape(-1)
        require(sg.numel() == H and sg.is_contiguous(), "gate_up_grouped_mma: the shared gate must be [H]")
    if out is None:
        out = torch.empty((T * k_top + T, packed.inter), device=x.device, dtype=x.dtype)
    rows = 2 * packed.inter
    args = (topk_weights, sorted_pairs, meta, max_blocks, block_m, packed.gate_up, rows, tiles, False)
    return _launch(out, x, sg, *args, packed.num_experts)


def down_grouped_mma(
    h: torch.Tensor,
    packed: MmaExperts,
    topk_weights: torch.Tensor,
    sorted_pairs: torch.Tensor,
    meta: torch.Tensor,
    max_blocks: int,
    block_m: int,
    tiles: Tiles | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """See ``down_grouped_reference``: h [N + T, I] bf16 CUDA -> y [N + T, H] bf16 by pair (into ``out``), for
    ``triton_prefill.sum_rows``."""
    require(
        packed.down is not None and h.dtype == torch.bfloat16 and h.is_cuda and h.is_contiguous()
        and h.shape[1] == packed.inter,
        "down_grouped_mma takes the down weights' copy and contiguous bf16 h [N + T, I]",
    )  # fmt: skip
    H = packed.down.shape[0] // (packed.num_experts + 1)
    if out is None:
        out = torch.empty((h.shape[0], H), device=h.device, dtype=h.dtype)
    args = (topk_weights, sorted_pairs, meta, max_blocks, block_m, packed.down, H, tiles, True)
    return _launch(out, h, None, *args, packed.num_experts)
