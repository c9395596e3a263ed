"""The kernel: CUDA C++ (compiled at run time by ``kernels/nvrtc.py``), one CTA a 16-row tile.

Why not Triton: a GEMV over the 12-bit format has to decode every weight, and the FMA form issues ~69
instructions per 8-element group (the Triton form that ``--pack-weights`` had, removed after it timed slower than
the bf16 plan although it moves 0.75 of the bytes); Triton's tensor-core forms take the A operand through shared
memory in 64-row tiles (slower still, docs/performance.md). Here each thread decodes its eight weights of a k16 step straight into
``mma.m16n8k16``'s A registers (8 integer ops and 4 ``prmt``), with x as the B operand (every one of its 8
columns the same x; column 0 of C is read): ~2.5 instructions an element in the sm_90 build.

CTA = SPLIT warps; warp w takes steps [w S/SPLIT, (w + 1) S/SPLIT) of its tile in chunks of 8 steps, the next
chunk's 6 16-byte loads a thread in flight while this one's 8 mma run; the warps' partial sums meet in shared
memory and are added in warp order (deterministic). Before the PDL wait: the first chunk, the row windows, the
escape pointers and the norm weight's words (weights; no kernel writes them). After it: x into shared memory,
normalised there in a norm tile (``rms_norm``'s math and rounding: every CTA reduces the same 2048 squares in the same order), then the
escapes' first entries. The escapes' corrections ``delta * x_n[col]`` are added after the warps' sum.
"""

from __future__ import annotations

import ctypes

import torch

from hyserve.kernels.nvrtc import Kernel, template_kernel

# device helpers shared with the other kernels over the fragment-ordered format (``moe/mma_grouped.py``)
HELPERS = r"""
typedef unsigned short bf16_t;

__device__ __forceinline__ float bf16_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned int w) { return __uint_as_float(w & 0xFFFF0000u); }
__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
  unsigned int r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], unsigned int a0, unsigned int a1, unsigned int a2,
                                         unsigned int a3, unsigned int b0, unsigned int b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// the four A registers of one k16 step: elements 0-3 from L0 and the low nibbles of w, 4-7 from L1 and the
// high nibbles; high byte = (c & 7) + base | (c & 8) << 4, four bytes at a time
__device__ __forceinline__ void decode8(unsigned int L0, unsigned int L1, unsigned int w, unsigned int base4,
                                        unsigned int& a0, unsigned int& a1, unsigned int& a2, unsigned int& a3) {
  const unsigned int ca = w & 0x0F0F0F0Fu, cb = (w >> 4) & 0x0F0F0F0Fu;
  const unsigned int ha = ((ca & 0x07070707u) + base4) | ((ca << 4) & 0x80808080u);
  const unsigned int hb = ((cb & 0x07070707u) + base4) | ((cb << 4) & 0x80808080u);
  a0 = __byte_perm(L0, ha, 0x5140);
  a1 = __byte_perm(L0, ha, 0x7362);
  a2 = __byte_perm(L1, hb, 0x5140);
  a3 = __byte_perm(L1, hb, 0x7362);
}

// the four A registers of k16 step i of a chunk (lo: the chunk's 4 low words, cd: its 2 code words)
__device__ __forceinline__ void decode_step(const uint4 (&lo)[4], const uint4 (&cd)[2], unsigned int base4, int i,
                                            unsigned int (&a)[4]) {
  const uint4 v = lo[i >> 1];
  const uint4 cw = cd[i >> 2];
  const unsigned int w = (i & 3) == 0 ? cw.x : (i & 3) == 1 ? cw.y : (i & 3) == 2 ? cw.z : cw.w;
  decode8((i & 1) ? v.z : v.x, (i & 1) ? v.w : v.y, w, base4, a[0], a[1], a[2], a[3]);
}

// c += a chunk's 8 k16 steps of a 16-row tile times a vector (bf16 pairs x2 from pair xb on; every B column the
// same, lane t's words xb + 8 i + t and + 4)
__device__ __forceinline__ void chunk_mma(float (&c)[4], const uint4 (&lo)[4], const uint4 (&cd)[2], unsigned int base4,
                                          const unsigned int* x2, int xb, int t) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    unsigned int a[4];
    decode_step(lo, cd, base4, i, a);
    mma_bf16(c, a[0], a[1], a[2], a[3], x2[xb + i * 8 + t], x2[xb + i * 8 + t + 4]);
  }
}

// a tile's rows g and g + 8 windows, one byte each: the decode's base, four bytes at a time
__device__ __forceinline__ unsigned int tile_base4(const int* base, int tile, int g) {
  const unsigned int bg = (unsigned int)__ldg(base + tile * 16 + g), bg8 = (unsigned int)__ldg(base + tile * 16 + g + 8);
  return bg | (bg << 8) | (bg8 << 16) | (bg8 << 24);
}

// the norm weight's words a thread applies at K = 2048 (NormWords, load_x)
template <int SPLIT>
constexpr int NORM_WORDS = SPLIT >= 8 ? 1 : 8 / SPLIT;

__device__ __forceinline__ float sumsq8(uint4 v) {
  float s = 0.f;
  const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float a = bf16_lo(w[i]), b = bf16_hi(w[i]);
    s += a * a;
    s += b * b;
  }
  return s;
}

// rms_norm_reference's math for 8 elements: (x * rstd) * (1 + g), rounded to bf16
__device__ __forceinline__ uint4 normalise8(uint4 v, uint4 gv, float rstd) {
  const unsigned int w[4] = {v.x, v.y, v.z, v.w}, g[4] = {gv.x, gv.y, gv.z, gv.w};
  unsigned int o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    o[i] = pack_bf16x2((bf16_lo(w[i]) * rstd) * (1.f + bf16_lo(g[i])), (bf16_hi(w[i]) * rstd) * (1.f + bf16_hi(g[i])));
  return make_uint4(o[0], o[1], o[2], o[3]);
}


// the sum of v over the CTA's SPLIT warps (warp order), each warp's total through red[SPLIT]
template <int SPLIT>
__device__ __forceinline__ float block_sum(float v, float* red, int warp, int lane) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < SPLIT; ++w) total += red[w];
  return total;
}

// The norm weight's 16-byte words a thread applies in load_x (words tid + j 32 SPLIT, j < NWR): a weight, which no
// kernel writes, so a kernel loads them before its PDL wait and the norm after it waits on x alone
template <int NWR>
struct NormWords {
  uint4 v[NWR > 0 ? NWR : 1];
  template <int SPLIT>
  __device__ __forceinline__ void load(const bf16_t* nw, bool norm, int K, int tid) {
    const uint4* g4 = reinterpret_cast<const uint4*>(nw);
#pragma unroll
    for (int j = 0; j < NWR; ++j) {
      const int i = tid + j * 32 * SPLIT;
      if (norm && i < (K >> 3)) v[j] = __ldg(g4 + i);
    }
  }
};

// x [K] into shared memory as the B operand: rms_norm(x) (rms_norm_reference's math and rounding; every CTA sums
// the same squares in the same order) when NORM, else x as it is (L2-coherent loads: the previous kernel wrote x).
// The norm weight's first NWR words a thread come from pre (NormWords::load), the rest from nw. Returns the norm's
// rstd (1 without the norm).
template <int SPLIT, int NWR = 0>
__device__ __forceinline__ float load_x(uint4* xs, const bf16_t* x, const bf16_t* nw, bool norm, float eps, int K,
                                        float* red, int tid, int warp, int lane,
                                        const NormWords<NWR>& pre = NormWords<NWR>()) {
  const uint4* x4 = reinterpret_cast<const uint4*>(x);
  if (!norm) {
    for (int i = tid; i < (K >> 3); i += 32 * SPLIT) xs[i] = __ldcg(x4 + i);
    return 1.f;
  }
  float ss = 0.f;
  for (int i = tid; i < (K >> 3); i += 32 * SPLIT) {
    const uint4 v = __ldcg(x4 + i);
    ss += sumsq8(v);
    xs[i] = v;
  }
  const float rstd = rsqrtf(block_sum<SPLIT>(ss, red, warp, lane) / (float)K + eps);
#pragma unroll
  for (int j = 0; j < NWR; ++j) {
    const int i = tid + j * 32 * SPLIT;
    if (i < (K >> 3)) xs[i] = normalise8(xs[i], pre.v[j], rstd);
  }
  const uint4* g4 = reinterpret_cast<const uint4*>(nw);
  for (int i = tid + NWR * 32 * SPLIT; i < (K >> 3); i += 32 * SPLIT) xs[i] = normalise8(xs[i], __ldg(g4 + i), rstd);
  return rstd;
}

// One row's escapes (entries [beg, end) of the CSR lists): the range and the first entry load early (weights: no
// kernel writes them), so that only rows with several wait on a load at the end
struct RowEscapes {
  int beg = 0, end = 0, col0 = 0;
  float d0 = 0.f;

  __device__ __forceinline__ void range(const int* eptr, int row) {
    beg = __ldg(eptr + row);
    end = __ldg(eptr + row + 1);
  }

  __device__ __forceinline__ void first(const int* ecol, const float* edelta) {
    if (beg < end) {
      col0 = __ldg(ecol + beg);
      d0 = __ldg(edelta + beg);
    }
  }

  // acc + delta * x[col] over the row's escapes, added one at a time in list order; x: the B operand, bf16
  __device__ __forceinline__ float add(float acc, const bf16_t* x, const int* ecol, const float* edelta) const {
    if (beg < end) {
      acc += d0 * bf16_lo((unsigned int)x[col0]);
      for (int e = beg + 1; e < end; ++e) acc += __ldg(edelta + e) * bf16_lo((unsigned int)x[__ldg(ecol + e)]);
    }
    return acc;
  }
};

// One warp's share of a 16-row tile: its chunks of 8 k16 steps (4 low-byte words of 2 steps, 2 code words of 4
// steps a thread), the rows' windows, and for threads 0-15 their row's escapes
struct TileStream {
  const uint4* lp;
  const uint4* cp;
  uint4 lo[4], cd[2];
  unsigned int base4;
  int s0, nch;
  RowEscapes esc;

  // the first chunk, the windows and the escape ranges: weights only, so before the PDL wait. The warp takes
  // steps [first + warp * per_warp, + per_warp) of the tile's K / 16; escapes: whether this CTA adds the rows'
  // escapes (a CTA of a K slice does only in one slice)
  __device__ __forceinline__ void begin(const uint4* low, const uint4* codes, const int* base, const int* eptr,
                                        int tile, int K, int first, int per_warp, bool escapes, int warp, int lane,
                                        int tid) {
    const int S = K >> 4, g = lane >> 2, r0 = tile * 16;
    s0 = first + warp * per_warp;
    nch = per_warp >> 3;
    lp = low + ((size_t)tile * (S >> 1) + (s0 >> 1)) * 32 + lane;
    cp = codes + ((size_t)tile * (S >> 2) + (s0 >> 2)) * 32 + lane;
#pragma unroll
    for (int i = 0; i < 4; ++i) lo[i] = __ldg(lp + i * 32);
#pragma unroll
    for (int i = 0; i < 2; ++i) cd[i] = __ldg(cp + i * 32);
    base4 = tile_base4(base, tile, g);
    if (escapes && tid < 16) esc.range(eptr, r0 + tid);
  }

  // c += the tile's rows times x2 (bf16 pairs in shared memory) over the warp's steps, a chunk in flight
  __device__ __forceinline__ void run(float (&c)[4], const unsigned int* x2, int t) {
#pragma unroll 1
    for (int ch = 0; ch < nch; ++ch) {
      uint4 lo_n[4], cd_n[2];
      if (ch + 1 < nch) {
        lp += 4 * 32;
        cp += 2 * 32;
#pragma unroll
        for (int i = 0; i < 4; ++i) lo_n[i] = __ldg(lp + i * 32);
#pragma unroll
        for (int i = 0; i < 2; ++i) cd_n[i] = __ldg(cp + i * 32);
      }
      chunk_mma(c, lo, cd, base4, x2, (s0 + ch * 8) * 8, t);
#pragma unroll
      for (int i = 0; i < 4; ++i) lo[i] = lo_n[i];
#pragma unroll
      for (int i = 0; i < 2; ++i) cd[i] = cd_n[i];
    }
  }

  // thread tid < 16: row tid's sum over the SPLIT warps (C column 0, warp order) plus its escapes' corrections
  template <int SPLIT>
  __device__ __forceinline__ float row_sum(const float (&c)[4], float (*part)[16], const bf16_t* xh, const int* ecol,
                                           const float* edelta, int warp, int lane, int tid) {
    if ((lane & 3) == 0) {
      part[warp][lane >> 2] = c[0];
      part[warp][(lane >> 2) + 8] = c[2];
    }
    __syncthreads();
    float acc = 0.f;
    if (tid < 16) {
#pragma unroll
      for (int w = 0; w < SPLIT; ++w) acc += part[w][tid];
      acc = esc.add(acc, xh, ecol, edelta);
    }
    return acc;
  }
};

__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
}

__device__ __forceinline__ bf16_t to_bf16(float v) {
  bf16_t out;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(out) : "f"(v));
  return out;
}
"""

SOURCE = (
    HELPERS
    + r"""
template <int SPLIT, bool NORM, bool PDL>
__global__ void __launch_bounds__(32 * SPLIT) gemv_mma(
    bf16_t* __restrict__ y, const bf16_t* __restrict__ x, const bf16_t* __restrict__ nw, float eps, int raw_from,
    const uint4* __restrict__ low, const uint4* __restrict__ codes, const int* __restrict__ base,
    const int* __restrict__ eptr, const int* __restrict__ ecol, const float* __restrict__ edelta, int K) {
  extern __shared__ uint4 xs[];  // [K / 8]: the B operand (x, normalised in a norm tile), bf16
  __shared__ float part[SPLIT][16];
  __shared__ float red[SPLIT];
  const int tile = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr int NWR = NORM_WORDS<SPLIT>;
  const bool norm = NORM && tile * 16 < raw_from;
  TileStream ts;
  ts.begin(low, codes, base, eptr, tile, K, 0, (K >> 4) / SPLIT, true, warp, lane, tid);
  NormWords<NWR> nwr;
  nwr.template load<SPLIT>(nw, norm, K, tid);
  if (PDL) pdl_wait();
  load_x<SPLIT, NWR>(xs, x, nw, norm, eps, K, red, tid, warp, lane, nwr);
  ts.esc.first(ecol, edelta);
  __syncthreads();
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  ts.run(c, reinterpret_cast<const unsigned int*>(xs), lane & 3);
  const float acc = ts.row_sum<SPLIT>(c, part, reinterpret_cast<const bf16_t*>(xs), ecol, edelta, warp, lane, tid);
  if (tid < 16) y[tile * 16 + tid] = to_bf16(acc);
}
"""
)

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_PARAMS = (_P, _P, _P, _F, _I, _P, _P, _P, _P, _P, _P, _I)
SPLITS = (2, 4, 8, 16)


def kernel(device: torch.device, split: int, norm: bool, pdl: bool) -> Kernel:
    """The compiled ``gemv_mma<split, norm, pdl>`` for ``device`` (once per process)."""
    return template_kernel(SOURCE, "gemv_mma", (split, norm, pdl), _PARAMS, device)
