"""The routing out-projection (one token) over the fragment-ordered 12-bit copy of [M; W_o], on tensor cores.

``project_out_route_mma`` computes what ``project_out_route_triton`` does (``project_out_route_reference``): h1
= h0 + W_o a written in place, the raw router logits ``W_r' h0 + M a`` and their top-k. The weight [E + H, Hv]
is packed by ``mma_gemv.pack_mma``; its rows stream through ``mma_gemv``'s tile code (CUDA, NVRTC).

At K = Hv = 4096 the 144 tiles of 16 rows are too few CTAs to stream at full rate, so each tile's K is cut into
KSPLIT slices, one CTA each (M's tiles first in the grid, so that the top-k's tail finishes under W_o's stream).
A CTA writes its 16 partial sums to a workspace, then takes a ticket on its tile; the tile's last CTA sums the
KSPLIT partials in slice order (deterministic) and adds h0 (W_o's rows: h1 stored, one cast) or ``W_r' h0`` (M's
rows: the raw logits stored). An M tile's last CTA then takes a ticket among M's tiles, and the last of those
takes the top-k of the E logits in one warp (ties to the lower expert id), writes the ids and their logits and
resets the counters. Escapes are added by each tile's slice-0 CTA (every CTA holds all of a in shared memory).
"""

from __future__ import annotations

import ctypes

import torch

from hyserve.kernels.contracts import require
from hyserve.kernels.mma_gemv import MmaPackedBF16
from hyserve.kernels.mma_gemv.cuda_kernel import HELPERS
from hyserve.kernels.nvrtc import template_kernel
from hyserve.kernels.pdl import enabled as pdl_enabled
from hyserve.kernels.tickets import ticket_counters

SOURCE = (
    HELPERS
    + r"""
// grid (E + H) / 16 * KSPLIT: CTA b takes tile b / KSPLIT, K slice b % KSPLIT
template <int SPLIT, int KSPLIT, bool PDL>
__global__ void __launch_bounds__(32 * SPLIT) project_route_mma(
    bf16_t* __restrict__ h, const bf16_t* __restrict__ a, const bf16_t* __restrict__ partial,
    float* __restrict__ part, float* __restrict__ raw, int* __restrict__ counters, int* __restrict__ ids,
    float* __restrict__ top, const uint4* __restrict__ low, const uint4* __restrict__ codes,
    const int* __restrict__ base, const int* __restrict__ eptr, const int* __restrict__ ecol,
    const float* __restrict__ edelta, int K, int E, int H, int k_top) {
  extern __shared__ uint4 xs[];  // [K / 8]: a, bf16
  __shared__ float partw[SPLIT][16];
  __shared__ int last;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int tile = blockIdx.x / KSPLIT, ks = blockIdx.x % KSPLIT, r0 = tile * 16, n_tiles = (E + H) >> 4;
  const int per_cta = (K >> 4) / KSPLIT;
  TileStream ts;
  ts.begin(low, codes, base, eptr, tile, K, ks * per_cta, per_cta / SPLIT, ks == 0, warp, lane, tid);
  if (PDL) pdl_wait();
  load_x<SPLIT>(xs, a, nullptr, false, 0.f, K, nullptr, tid, warp, lane);
  ts.esc.first(ecol, edelta);
  __syncthreads();
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  ts.run(c, reinterpret_cast<const unsigned int*>(xs), lane & 3);
  const float acc = ts.row_sum<SPLIT>(c, partw, reinterpret_cast<const bf16_t*>(xs), ecol, edelta, warp, lane, tid);
  if (tid < 16) part[(size_t)ks * (E + H) + r0 + tid] = acc;
  __threadfence();  // this CTA's partials visible before its ticket
  __syncthreads();
  if (tid == 0) last = atomicAdd(counters + tile, 1) == KSPLIT - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // the other slices' partials, seen through their tickets
  if (tid < 16) {
    const int row = r0 + tid;
    float y = 0.f;
    for (int k = 0; k < KSPLIT; ++k) y += __ldcg(part + (size_t)k * (E + H) + row);
    if (row < E) {
      raw[row] = y + __uint_as_float((unsigned int)partial[row] << 16);
    } else {
      h[row - E] = to_bf16(y + __uint_as_float((unsigned int)h[row - E] << 16));
    }
  }
  if (tid == 0) counters[tile] = 0;
  if (r0 >= E) return;
  __threadfence();  // this tile's logits visible before its ticket among M's tiles
  __syncthreads();
  if (tid == 0) last = atomicAdd(counters + n_tiles, 1) == (E >> 4) - 1;
  __syncthreads();
  if (!last || warp != 0) return;
  __threadfence();
  // the top-k of raw[0 .. E) in one warp: lane l holds logits l*EL .. l*EL + EL - 1 (E <= 32 * 16)
  const int EL = (E + 31) >> 5;
  float v[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j] = (j < EL && lane * EL + j < E) ? __ldcg(raw + lane * EL + j) : __int_as_float(0xff800000);
  for (int q = 0; q < k_top; ++q) {
    float best = __int_as_float(0xff800000);
    int bi = 0x7FFFFFFF;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int idx = lane * EL + j;
      if (j < EL && (v[j] > best || (v[j] == best && idx < bi))) {
        best = v[j];
        bi = idx;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xFFFFFFFFu, best, o);
      const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
      if (ob > best || (ob == best && oi < bi)) {
        best = ob;
        bi = oi;
      }
    }
    if (lane == 0) {
      ids[q] = bi;
      top[q] = best;
    }
#pragma unroll
    for (int j = 0; j < 16; ++j)
      if (lane * EL + j == bi) v[j] = __int_as_float(0xff800000);
  }
  if (lane == 0) counters[n_tiles] = 0;
}
"""
)

_P, _I = ctypes.c_void_p, ctypes.c_int
_PARAMS = (_P,) * 14 + (_I,) * 4


def project_out_route_mma(
    a: torch.Tensor,
    packed: MmaPackedBF16,
    residual: torch.Tensor,
    partial: torch.Tensor,
    top_k: int,
    plan: dict,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: a [1, Hv] bf16, the packed [E + H, Hv] weight (M, then W_o), residual h0 [1, H] (updated in
    place to h1), partial ``W_r' h0`` [1, E] bf16 -> (topk_ids [1, k] int32, their raw logits [1, k] fp32).
    plan: SPLIT (warps a CTA) and KSPLIT (CTAs a tile, over K)."""
    n, k = packed.shape
    hidden, experts = residual.shape[1], partial.shape[1]
    split, ksplit = plan["SPLIT"], plan["KSPLIT"]
    require(
        n == experts + hidden and a.shape == (1, k) and experts % 16 == 0 and experts <= 512 and top_k <= experts
        and a.dtype == residual.dtype == partial.dtype == torch.bfloat16 and a.is_contiguous()
        and residual.is_contiguous() and partial.stride(-1) == 1,
        f"project_out_route_mma takes one bf16 token a [1, {k}], h0 [1, {n - experts}] and W_r' h0 [1, E] "
        f"(E <= 512, a multiple of 16); got {tuple(a.shape)}, {tuple(residual.shape)}, {tuple(partial.shape)}",
    )  # fmt: skip
    require(
        k % (128 * split * ksplit) == 0,
        f"project_out_route_mma: {ksplit} x {split} warps do not divide K {k}",
    )
    dev = a.device
    ids = torch.empty((1, top_k), dtype=torch.int32, device=dev)
    top = torch.empty((1, top_k), dtype=torch.float32, device=dev)
    part = torch.empty((ksplit, n), dtype=torch.float32, device=dev)
    raw = torch.empty((experts,), dtype=torch.float32, device=dev)
    counters = ticket_counters("routed projection (mma)", dev, n // 16 + 1)
    pdl = pdl_enabled(a)
    template_kernel(SOURCE, "project_route_mma", (split, ksplit, pdl), _PARAMS, dev).launch(
        n // 16 * ksplit,
        32 * split,
        (residual, a, partial, part, raw, counters, ids, top, packed.low, packed.codes, packed.base,
         packed.escape_ptr, packed.escape_col, packed.escape_delta, k, experts, hidden, top_k),
        shared_mem=2 * k,
        pdl=pdl,
    )  # fmt: skip
    return ids, top
