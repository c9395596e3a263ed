"""The few-token MoE down over the experts' fragment-ordered 12-bit down copy (``--mma-experts``), on tensor cores:
the contract of ``triton_pairs.down_pairs`` (one token's k routed pairs and its shared expert summed in fp32, the
residual added before the one cast) with 0.75 of its weight bytes.

Why this kernel can win where the one-token gate_up over the same format lost (docs/performance.md, 2026-12-06):
the down kernel's expert ids come from the routing two launches back and its weights are no kernel's output, so
under PDL every CTA loads its expert ids and **all** of its weights into registers before its wait, while the
gate_up kernel finishes; only h (9 KB a token) and the residual load after it. At one token the whole down
(9 experts x 2048 x 512, 14.2 MB in the format) is 128 CTAs of 110 KB, one an SM, one wave.

CTA (tile, t) = output rows [16 tile, + 16) of token t: warp w = j KSPLIT + ks takes slot j's expert (j < k: the
token's routed expert j, j = k: the shared expert) over its K slice ks of I (NCH chunks of 8 k16 steps), decoding
each step's weights straight into ``mma.m16n8k16``'s A registers (``kernels/mma_gemv``), h's row of the slot the B
operand (every column the same, column 0 read) from shared memory. The warps' sums meet in shared memory and are
added in warp order (deterministic); a slot's escapes add ``delta * h[col]`` to their rows.
"""

from __future__ import annotations

import ctypes

import torch

from hyserve.kernels.contracts import require
from hyserve.kernels.moe.mma_experts import MmaExperts, unpack_mma_down
from hyserve.kernels.moe.mma_grouped_cuda import SOURCE as GROUPED_SOURCE
from hyserve.kernels.nvrtc import template_kernel
from hyserve.kernels.pdl import enabled as pdl_enabled

# the largest token count the decode path routes here, and the K split of a slot's 16-row tile (warps a slot)
MAX_TOKENS = 1
KSPLIT = 2
KSPLITS = (1, 2)

SOURCE = (
    GROUPED_SOURCE
    + r"""
// grid (H / 16, T), 32 SLOTS KSPLIT threads; out [T, out_ld] (+= with add_out), h [T (SLOTS - 1) + T, I] (the routed
// pairs, then the shared expert's rows), ids [T, SLOTS - 1]; I = 128 NCH KSPLIT
template <int SLOTS, int KSPLIT, int NCH, bool PDL>
__global__ void __launch_bounds__(32 * SLOTS * KSPLIT) down_pairs_mma(
    bf16_t* __restrict__ out, const bf16_t* __restrict__ h, const int* __restrict__ ids, const uint4* __restrict__ low,
    const uint4* __restrict__ codes, const int* __restrict__ base, const int* __restrict__ eptr,
    const int* __restrict__ ecol, const float* __restrict__ edelta, int T, int H, int E, int out_ld, int add_out) {
  constexpr int I = 128 * NCH * KSPLIT, S = I / 16, THREADS = 32 * SLOTS * KSPLIT;
  __shared__ uint4 hs[SLOTS][I / 8];  // the token's h rows, bf16: the B operands
  __shared__ float part[SLOTS * KSPLIT][16];
  const int tile = blockIdx.x, tok = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3, j = warp / KSPLIT, ks = warp % KSPLIT, s0 = ks * NCH * 8;
  // before the wait: the ids (the routing ran two launches back), the weights, the rows' windows and escape ranges
  const int e = j < SLOTS - 1 ? __ldcg(ids + tok * (SLOTS - 1) + j) : E;
  const int ptile = e * (H >> 4) + tile;
  const uint4* lp = low + ((size_t)ptile * (S >> 1) + (s0 >> 1)) * 32 + lane;
  const uint4* cp = codes + ((size_t)ptile * (S >> 2) + (s0 >> 2)) * 32 + lane;
  uint4 lo[NCH][4], cd[NCH][2];
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch) {
#pragma unroll
    for (int i = 0; i < 4; ++i) lo[ch][i] = __ldg(lp + ch * 128 + i * 32);
#pragma unroll
    for (int i = 0; i < 2; ++i) cd[ch][i] = __ldg(cp + ch * 64 + i * 32);
  }
  const unsigned int base4 = tile_base4(base, ptile, g);
  int e_beg = 0, e_end = 0, e_col0 = 0;
  float e_d0 = 0.f;
  if (ks == 0 && lane < 16) {  // lane r: the escapes of the slot's row r
    e_beg = __ldg(eptr + ptile * 16 + lane);
    e_end = __ldg(eptr + ptile * 16 + lane + 1);
    if (e_beg < e_end) e_col0 = __ldg(ecol + e_beg), e_d0 = __ldg(edelta + e_beg);
  }
  if (PDL) pdl_wait();
  const int N = T * (SLOTS - 1);
  for (int i = tid; i < SLOTS * (I / 8); i += THREADS) {
    const int jj = i / (I / 8), c = i % (I / 8), row = jj < SLOTS - 1 ? tok * (SLOTS - 1) + jj : N + tok;
    hs[jj][c] = __ldcg(reinterpret_cast<const uint4*>(h + (size_t)row * I) + c);
  }
  bf16_t* o = out + (size_t)tok * out_ld + tile * 16;
  const float r = add_out && tid < 16 ? bf16_lo((unsigned int)o[tid]) : 0.f;
  __syncthreads();
  const unsigned int* h2 = reinterpret_cast<const unsigned int*>(hs[j]);  // slot j's h as bf16 pairs
  float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      unsigned int a[4];
      decode_step(lo[ch], cd[ch], base4, i, a);
      const int w0 = (s0 + ch * 8 + i) * 8 + t;
      mma_bf16(c, a[0], a[1], a[2], a[3], h2[w0], h2[w0 + 4]);
    }
  }
  if (t == 0) {
    part[warp][g] = c[0];
    part[warp][g + 8] = c[2];
  }
  __syncwarp();
  if (e_beg < e_end) {
    const bf16_t* hr = reinterpret_cast<const bf16_t*>(hs[j]);
    float d = e_d0 * bf16_lo((unsigned int)hr[e_col0]);
    for (int q = e_beg + 1; q < e_end; ++q) d += __ldg(edelta + q) * bf16_lo((unsigned int)hr[__ldg(ecol + q)]);
    part[warp][lane] += d;
  }
  __syncthreads();
  if (tid < 16) {
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < SLOTS * KSPLIT; ++w) acc += part[w][tid];
    o[tid] = to_bf16(acc + r);
  }
}
"""
)

_P, _I = ctypes.c_void_p, ctypes.c_int
_PARAMS = (_P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I)


def down_pairs_mma_takes(packed: object, h: torch.Tensor, topk_ids: torch.Tensor | None) -> bool:
    """Whether the decode path routes this down here: the experts' down copy, bf16 h, int32 ids of at most
    MAX_TOKENS tokens, and I a multiple of 128 KSPLIT."""
    if not isinstance(packed, MmaExperts) or packed.down is None or topk_ids is None:
        return False
    T, k = topk_ids.shape
    return (
        h.dtype == torch.bfloat16
        and topk_ids.dtype == torch.int32
        and 0 < T <= MAX_TOKENS
        and packed.inter % (128 * KSPLIT) == 0
        and 32 * (k + 1) * KSPLIT <= 1024
    )


def down_pairs_mma_reference(
    h: torch.Tensor,
    packed: MmaExperts,
    topk_ids: torch.Tensor,
    out: torch.Tensor | None = None,
    add_out: bool = False,
) -> torch.Tensor:
    """h [T k + T, I] (the routed pairs' rows, then the shared expert's), topk_ids [T, k] -> [T, H] in h's dtype:
    ``out[t] (+)= sum_j h[t k + j] W_down[e_tj]^T + h[T k + t] shared_down^T`` in fp32 from the unpacked weights,
    the residual (``add_out``: out's contents) added before the one cast."""
    w, shared = unpack_mma_down(packed)
    T, k = topk_ids.shape
    hf = h.float()
    y = torch.einsum("tji,tjhi->th", hf[: T * k].view(T, k, -1), w[topk_ids.long()].float())
    y = y + hf[T * k :] @ shared.float().T
    if add_out and out is not None:
        y = y + out.float()
    res = y.to(h.dtype)
    if out is None:
        return res
    out.copy_(res)
    return out


def down_pairs_mma(
    h: torch.Tensor,
    packed: MmaExperts,
    topk_ids: torch.Tensor,
    out: torch.Tensor | None = None,
    add_out: bool = False,
    ksplit: int = KSPLIT,
) -> torch.Tensor:
    """See ``down_pairs_mma_reference``: h [T k + T, I] bf16 CUDA (contiguous), topk_ids [T, k] int32 -> out [T, H]
    bf16. ``ksplit``: the warps a slot's K is split over (``KSPLITS``)."""
    T, k = topk_ids.shape
    inter = packed.inter
    require(
        packed.down is not None and h.dtype == torch.bfloat16 and h.is_cuda and h.is_contiguous()
        and h.shape == (T * k + T, inter),
        f"down_pairs_mma takes the down weights' copy and contiguous bf16 h [T k + T, I] = {(T * k + T, inter)}, "
        f"got {h.dtype} {tuple(h.shape)}",
    )  # fmt: skip
    require(
        topk_ids.dtype == torch.int32 and topk_ids.is_contiguous(),
        "down_pairs_mma takes contiguous int32 topk_ids",
    )
    require(
        ksplit in KSPLITS and inter % (128 * ksplit) == 0 and 32 * (k + 1) * ksplit <= 1024,
        f"down_pairs_mma: KSPLIT {ksplit} must be one of {KSPLITS}, divide I = {inter} in chunks of 128 and keep "
        f"32 (k + 1) KSPLIT threads <= 1024 (k = {k})",
    )
    H = packed.down.shape[0] // (packed.num_experts + 1)
    if out is None:
        out = torch.empty((T, H), device=h.device, dtype=h.dtype)
    require(
        out.dtype == h.dtype and out.shape == (T, H) and out.stride(1) == 1,
        f"down_pairs_mma: out must be bf16 [{T}, {H}] with unit column stride",
    )
    p, pdl = packed.down, pdl_enabled(h)
    template_kernel(SOURCE, "down_pairs_mma", (k + 1, ksplit, inter // 128 // ksplit, pdl), _PARAMS, h.device).launch(
        (H // 16, T),
        32 * (k + 1) * ksplit,
        (out, h, topk_ids, p.low, p.codes, p.base, p.escape_ptr, p.escape_col, p.escape_delta, T, H,
         packed.num_experts, out.stride(0), int(add_out)),
        pdl=pdl,
    )  # fmt: skip
    return out
