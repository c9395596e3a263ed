"""The CUDA source of ``mma_grouped``'s kernels (compiled at run time by ``kernels/nvrtc.py``): ``grouped_mma`` (mma.sync)
and ``grouped_wgmma`` (wgmma with the decoded weights as the register A operand), the device functions they share
(the block's rows, the x chunk copies, the shared expert's gate, the escapes and the stores), and the generated
``wgmma.mma_async`` instances. The contracts, layouts and plans are ``mma_grouped.py``'s docstring."""

from __future__ import annotations

from hyserve.kernels.mma_gemv.cuda_kernel import HELPERS


def _wgmma_source(max_n: int = 128) -> str:
    """``wgmma_chunk<NT, BM>``: the 8 k16 steps of a chunk as ``wgmma.mma_async`` m64nNk16 (A, the warpgroup's 64
    decoded weight rows, from registers; B, N of the block's tokens, from a swizzled buffer), N the block's tokens
    rounded up to 16 (one instance an N up to max_n, chosen at run time). The accumulators are the mma.sync
    layout's (``d[j][q]``: row g + 8 (q >> 1), column 8 j + 2 t + (q & 1)), so the epilogue is shared."""
    fns, cases = [], []
    for n in range(16, max_n + 1, 16):
        nd = n // 2
        regs = ", ".join(f"%{i}" for i in range(nd))
        outs = ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(nd))
        fns.append(
            f"template <int NT>\n__device__ __forceinline__ void wgmma_n{n}(float (&d)[NT][4], const unsigned int (&a)[4], "
            f"unsigned long long desc) {{\n"
            f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{nd + 5}, 0;\\n"\n'
            f'               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{regs}}}, '
            f'{{%{nd}, %{nd + 1}, %{nd + 2}, %{nd + 3}}}, %{nd + 4}, p, 1, 1, 0;\\n}}\\n"\n'
            f"               : {outs}\n"
            f'               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));\n}}\n'
        )
        cases.append(
            f"    case {n // 16}:\n      if constexpr (NT * 8 >= {n}) {{\n#pragma unroll\n"
            f"        for (int i = 0; i < 8; ++i) wgmma_n{n}<NT>(d, a[i], sw128_desc(sb + (i >> 2) * BM * 128 + (i & 3) * 32));\n"
            f"      }}\n      break;\n"
        )
    return (
        "".join(fns)
        + r"""
// K-major, 128-byte swizzle, 8-row groups 1024 bytes apart; the k16 step's 32 bytes of a row from the address
__device__ __forceinline__ unsigned long long sw128_desc(unsigned int addr) {
  return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

template <int NT>
__device__ __forceinline__ void fence_acc(float (&d)[NT][4]) {  // the accumulators stay put around the async ops
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) asm volatile("" : "+f"(d[j][q])::"memory");
}

template <int NT, int BM>
__device__ __forceinline__ void wgmma_chunk(float (&d)[NT][4], unsigned int (&a)[8][4], unsigned int sb, int n16) {
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int q = 0; q < 4; ++q) asm volatile("" : "+r"(a[i][q])::"memory");
  fence_acc<NT>(d);
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  switch (n16) {
"""
        + "".join(cases)
        + r"""  }
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  fence_acc<NT>(d);
}
"""
    )


SOURCE = (
    HELPERS
    + _wgmma_source()
    + r"""
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
// ask L2 for n bytes at p (16-byte aligned, n a multiple of 16): one instruction, no registers, nothing to wait on
__device__ __forceinline__ void l2_prefetch(const void* p, unsigned int n) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(unsigned int (&r)[4], const void* smem) {
  const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

// element offset of 16-byte segment s (of 16) of row r in a chunk buffer of BM rows x 128 columns: rows padded to
// LD (ldmatrix without bank conflicts), or for wgmma the K-major 128-byte swizzle (two panels of 64 columns x BM
// rows, 128 bytes a row; segment s & 7 of row r at position (s & 7) ^ (r & 7) of its row)
template <int BM, int LD, bool WG>
__device__ __forceinline__ int seg_off(int r, int s) {
  return WG ? (s >> 3) * BM * 64 + r * 64 + (((s & 7) ^ (r & 7)) << 3) : r * LD + s * 8;
}

// cp.async of the rows [0, cnt) of chunk ch (columns [128 ch, + 128)) of the source rows src[r] into dst (rows
// padded to LD)
template <int LD, int THREADS>
__device__ __forceinline__ void load_x(bf16_t* dst, const bf16_t* x, const int* src, int cnt, int K, int ch, int tid) {
  for (int i = tid; i < cnt * 16; i += THREADS) {
    const int r = i >> 4, s = i & 15;
    cp_async16(dst + r * LD + s * 8, x + (size_t)src[r] * K + ch * 128 + s * 8);
  }
}

// the same into dst in wgmma's swizzle (seg_off<BM, 0, true>, its row-invariant terms hoisted: nvcc does not, and
// the copies are on the K loop's path): thread i copies segment i & 15 of rows i >> 4, + THREADS / 16, ...
template <int BM, int THREADS>
__device__ __forceinline__ void load_x_swizzled(bf16_t* dst, const bf16_t* x, const int* src, int cnt, int K, int ch,
                                                int tid) {
  const int s = tid & 15, sl = s & 7, col = ch * 128 + s * 8;
  bf16_t* d = dst + (s >> 3) * BM * 64;
  for (int r = tid >> 4; r < cnt; r += THREADS / 16)
    cp_async16(d + r * 64 + ((sl ^ (r & 7)) << 3), x + (size_t)src[r] * K + col);
}

// the block's rows r < BM: src[r] the row of x it reads, dst[r] the row it writes, wrow[r] its routing weight (1 for
// the shared expert and past cnt). gate_up: x by token, out by routing row; DOWN: x = h by routing row, out = y by
// pair (row t k + j: token t's slot j; row N + t its shared expert's)
template <int BM, bool DOWN, int THREADS>
__device__ __forceinline__ void block_rows(int* src, int* dst, float* wrow, const int* sorted, const float* topk_w,
                                           int row0, int cnt, int N, int k_top, int tid) {
  for (int r = tid; r < BM; r += THREADS) {
    const int pos = row0 + r;
    int tk = 0, pair = pos;
    float w = 1.f;
    if (r < cnt) {
      if (pos >= N) {
        tk = pos - N;
      } else {
        pair = __ldcg(sorted + pos);
        tk = pair / k_top;
        w = __ldcg(topk_w + pair);
      }
    }
    src[r] = DOWN ? (r < cnt ? pos : 0) : tk;
    dst[r] = DOWN ? pair : pos;
    wrow[r] = w;
  }
}

// PDL's wait, then block blockIdx.y's expert e, first routing row row0, row count cnt and its rows (block_rows);
// false past the routing's block count (the CTA exits: CUDA-graph safe)
template <int BM, bool DOWN, bool PDL, int THREADS>
__device__ __forceinline__ bool block_begin(int& e, int& row0, int& cnt, int* src, int* dst, float* wrow,
                                            const int* meta, int maxb, const int* sorted, const float* topk_w, int N,
                                            int k_top, int tid) {
  const int b = blockIdx.y;
  if (PDL) pdl_wait();
  if (b >= __ldcg(meta + 3 * maxb)) return false;
  e = __ldcg(meta + b), row0 = __ldcg(meta + maxb + b), cnt = __ldcg(meta + 2 * maxb + b);
  block_rows<BM, DOWN, THREADS>(src, dst, wrow, sorted, topk_w, row0, cnt, N, k_top, tid);
  return true;
}

// the shared expert's gate: thread (row r, quarter) adds chunk xb's 32 columns of its rows to gs
template <int BM, int LD, bool WG, int GROWS, int THREADS>
__device__ __forceinline__ void gate_chunk(float (&gs)[GROWS], const bf16_t* xb, const bf16_t* sgate, int ch,
                                           int cnt, int tid) {
#pragma unroll
  for (int q = 0; q < GROWS; ++q) {
    const int r = (tid >> 2) + q * (THREADS >> 2);
    if (r < cnt) {
      const uint4* sr = reinterpret_cast<const uint4*>(sgate + ch * 128 + (tid & 3) * 32);
      float s = 0.f;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const uint4 xv = *reinterpret_cast<const uint4*>(xb + seg_off<BM, LD, WG>(r, 4 * (tid & 3) + u));
        const uint4 sv = __ldg(sr + u);
        const unsigned int xw[4] = {xv.x, xv.y, xv.z, xv.w}, sw[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
        for (int m = 0; m < 4; ++m) s += bf16_lo(xw[m]) * bf16_lo(sw[m]) + bf16_hi(xw[m]) * bf16_hi(sw[m]);
      }
      gs[q] += s;
    }
  }
}

// the rows' sums (four threads a row) -> wrow = sigmoid(sum); a __syncthreads before wrow is read
template <int GROWS, int THREADS>
__device__ __forceinline__ void gate_finish(float* wrow, const float (&gs)[GROWS], int cnt, int tid) {
#pragma unroll
  for (int q = 0; q < GROWS; ++q) {
    float s = gs[q];
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 1);
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 2);
    const int r = (tid >> 2) + q * (THREADS >> 2);
    if ((tid & 3) == 0 && r < cnt) wrow[r] = 1.f / (1.f + __expf(-s));
  }
}

// the escapes of the thread's rows g and g + 8 of packed tile `tile`: + delta * x[source row, col] for its columns
template <int NT>
__device__ __forceinline__ void tile_escapes(float (&c)[NT][4], int tile, const bf16_t* x, int K, const int* src,
                                             const int* eptr, const int* ecol, const float* edelta, int cnt, int g,
                                             int t) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = tile * 16 + g + 8 * half;
    const int e1 = __ldg(eptr + row + 1);
    for (int q = __ldg(eptr + row); q < e1; ++q) {
      const int col = __ldg(ecol + q);
      const float d = __ldg(edelta + q);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int n = 8 * j + 2 * t + cc;
          if (n < cnt) c[j][2 * half + cc] += d * bf16_lo((unsigned int)__ldcg(x + (size_t)src[n] * K + col));
        }
      }
    }
  }
}

// the results of tile tin (of the expert's) to the block's output rows: DOWN, rows g and g + 8 are output columns
// 16 tin + g and + 8; gate_up, row g is gate column 8 tin + g and row g + 8 the up column of the same index
template <int NT, bool DOWN>
__device__ __forceinline__ void tile_store(const float (&c)[NT][4], int tin, bf16_t* out, int out_ld, const int* dst,
                                           const float* wrow, int cnt, int g, int t) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int n = 8 * j + 2 * t + cc;
      if (n < cnt) {
        bf16_t* o = out + (size_t)dst[n] * out_ld;
        if (DOWN) {
          o[16 * tin + g] = to_bf16(c[j][cc]);
          o[16 * tin + g + 8] = to_bf16(c[j][2 + cc]);
        } else {
          const float gv = c[j][cc], uv = c[j][2 + cc];
          o[8 * tin + g] = to_bf16(gv / (1.f + __expf(-gv)) * uv * wrow[n]);
        }
      }
    }
  }
}

// chunks [0, nch) through DEPTH + 1 register buffers: step(ch, cur, nxt) runs chunk ch from cur while chunk ch + DEPTH
// loads into nxt (chunk ch - 1's); the loop is unrolled over the buffers, so no register moves
template <int DEPTH, typename Step>
__device__ __forceinline__ void ring_chunks(int nch, uint4 (&w0)[6], uint4 (&w1)[6], uint4 (&w2)[6], Step& step) {
#pragma unroll 1
  for (int ch = 0; ch < nch; ch += DEPTH + 1) {
    if constexpr (DEPTH == 1) {
      step(ch, w0, w1);
      if (ch + 1 < nch) step(ch + 1, w1, w0);
    } else {
      step(ch, w0, w2);
      if (ch + 1 < nch) step(ch + 1, w1, w0);
      if (ch + 2 < nch) step(ch + 2, w2, w1);
    }
  }
}

// grid (R / 16 / (WARPS RT), MAXB), R the packed rows an expert has (2I for gate_up, H for down); NT = BLOCK_M / 8
// column groups of 8 rows; block_rows' x and out. mma.sync: warp w streams RT consecutive 16-row tiles over all of
// K (the next chunk's weights in registers while this one's run), the block's x rows in three padded chunk buffers
template <int NT, int WARPS, int RT, bool DOWN, bool PDL>
__global__ void __launch_bounds__(32 * WARPS) grouped_mma(
    bf16_t* __restrict__ out, const bf16_t* __restrict__ x, const bf16_t* __restrict__ sgate,
    const float* __restrict__ topk_w, const int* __restrict__ sorted, const int* __restrict__ meta,
    const uint4* __restrict__ low, const uint4* __restrict__ codes, const int* __restrict__ base,
    const int* __restrict__ eptr, const int* __restrict__ ecol, const float* __restrict__ edelta,
    int N, int K, int R, int out_ld, int E, int maxb, int k_top) {
  constexpr int BM = NT * 8, LD = 128 + 8, THREADS = 32 * WARPS, BUF = BM * LD;
  constexpr int GROWS = (BM * 4 + THREADS - 1) / THREADS;  // shared-gate rows a thread sums (4 threads a row)
  extern __shared__ __align__(16) bf16_t xs[];  // [3][BM][LD]: x chunks
  __shared__ int src[BM], dst[BM];
  __shared__ float wrow[BM];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  int e, row0, cnt;
  if (!block_begin<BM, DOWN, PDL, THREADS>(e, row0, cnt, src, dst, wrow, meta, maxb, sorted, topk_w, N, k_top, tid))
    return;
  const int tin0 = (blockIdx.x * WARPS + warp) * RT, tile0 = e * (R >> 4) + tin0;
  const int S = K >> 4, nch = K >> 7;
  const uint4* lp = low + (size_t)tile0 * (S >> 1) * 32 + lane;
  const uint4* cp = codes + (size_t)tile0 * (S >> 2) * 32 + lane;
  uint4 lo[RT][4], cd[RT][2];
  unsigned int base4[RT];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) lo[rt][i] = __ldg(lp + (size_t)rt * (S >> 1) * 32 + i * 32);
#pragma unroll
    for (int i = 0; i < 2; ++i) cd[rt][i] = __ldg(cp + (size_t)rt * (S >> 2) * 32 + i * 32);
    base4[rt] = tile_base4(base, tile0 + rt, g);
  }
  __syncthreads();  // src
  load_x<LD, THREADS>(xs, x, src, cnt, K, 0, tid);
  cp_async_commit();
  if (nch > 1) load_x<LD, THREADS>(xs + BUF, x, src, cnt, K, 1, tid);
  cp_async_commit();

  const int nt = (cnt + 7) >> 3;
  float c[RT][NT][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int j = 0; j < NT; ++j) c[rt][j][0] = c[rt][j][1] = c[rt][j][2] = c[rt][j][3] = 0.f;
  float gs[GROWS];
#pragma unroll
  for (int q = 0; q < GROWS; ++q) gs[q] = 0.f;
  const bool gate = !DOWN && e == E && sgate;
  // ldmatrix: lane l gives the address of row (l & 7) of matrix l >> 3: matrices (rows 16jj.., k 0-7), (.., k
  // 8-15), (rows 16jj + 8.., k 0-7), (.., k 8-15) -> b0, b1 of column group 2jj, then of 2jj + 1
  const int lrow = (lane & 7) + ((lane >> 4) << 3), lcol = ((lane >> 3) & 1) << 3;
#pragma unroll 1
  for (int ch = 0; ch < nch; ++ch) {
    uint4 lo_n[RT][4], cd_n[RT][2];
    if (ch + 1 < nch) {
      lp += 4 * 32;
      cp += 2 * 32;
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) lo_n[rt][i] = __ldg(lp + (size_t)rt * (S >> 1) * 32 + i * 32);
#pragma unroll
        for (int i = 0; i < 2; ++i) cd_n[rt][i] = __ldg(cp + (size_t)rt * (S >> 2) * 32 + i * 32);
      }
    }
    cp_async_wait<1>();  // chunk ch has landed (only ch + 1 may still be in flight)
    __syncthreads();     // ... for every thread's copies; and every warp is done with chunk ch - 1's buffer
    if (ch + 2 < nch) load_x<LD, THREADS>(xs + (ch + 2) % 3 * BUF, x, src, cnt, K, ch + 2, tid);
    cp_async_commit();
    const bf16_t* xb = xs + (ch % 3) * BUF;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      unsigned int a[RT][4];
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) decode_step(lo[rt], cd[rt], base4[rt], i, a[rt]);
#pragma unroll
      for (int jj = 0; jj < NT / 2; ++jj) {
        if (2 * jj < nt) {
          unsigned int bb[4];
          ldmatrix_x4(bb, xb + (16 * jj + lrow) * LD + 16 * i + lcol);
#pragma unroll
          for (int rt = 0; rt < RT; ++rt) {
            mma_bf16(c[rt][2 * jj], a[rt][0], a[rt][1], a[rt][2], a[rt][3], bb[0], bb[1]);
            if (2 * jj + 1 < nt) mma_bf16(c[rt][2 * jj + 1], a[rt][0], a[rt][1], a[rt][2], a[rt][3], bb[2], bb[3]);
          }
        }
      }
    }
    if (gate) gate_chunk<BM, LD, false, GROWS, THREADS>(gs, xb, sgate, ch, cnt, tid);
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) lo[rt][i] = lo_n[rt][i];
#pragma unroll
      for (int i = 0; i < 2; ++i) cd[rt][i] = cd_n[rt][i];
    }
  }
  if (gate) gate_finish<GROWS, THREADS>(wrow, gs, cnt, tid);
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) tile_escapes<NT>(c[rt], tile0 + rt, x, K, src, eptr, ecol, edelta, cnt, g, t);
  __syncthreads();  // wrow
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) tile_store<NT, DOWN>(c[rt], tin0 + rt, out, out_ld, dst, wrow, cnt, g, t);
}

// The same contract on wgmma: warp w takes one 16-row tile and each warpgroup's four tiles are the A operand of one
// m64nNk16 a k16 step (wgmma_chunk). A warp's weights stream from global memory into DEPTH + 1 register buffers,
// DEPTH chunks ahead of the one it decodes (no register moves: the loop is unrolled over the buffers), and its lane 0
// asks L2 for the L2A chunks after those (more of the stream in flight than the registers hold); the block's x rows
// pass through three chunk buffers in the swizzle the tensor cores read
template <int NT, int WARPS, int DEPTH, int L2A, bool DOWN, bool PDL>
__global__ void __launch_bounds__(32 * WARPS) grouped_wgmma(
    bf16_t* __restrict__ out, const bf16_t* __restrict__ x, const bf16_t* __restrict__ sgate,
    const float* __restrict__ topk_w, const int* __restrict__ sorted, const int* __restrict__ meta,
    const uint4* __restrict__ low, const uint4* __restrict__ codes, const int* __restrict__ base,
    const int* __restrict__ eptr, const int* __restrict__ ecol, const float* __restrict__ edelta,
    int N, int K, int R, int out_ld, int E, int maxb, int k_top) {
  constexpr int BM = NT * 8, THREADS = 32 * WARPS, BUF = BM * 128;
  constexpr int GROWS = (BM * 4 + THREADS - 1) / THREADS;
  static_assert(WARPS % 4 == 0 && (DEPTH == 1 || DEPTH == 2), "whole warpgroups; one or two chunks ahead");
  // [3][BUF] x chunks from a 1024-byte boundary (the swizzle's period)
  extern __shared__ __align__(16) unsigned char smem[];
  const unsigned int s0 = (unsigned int)__cvta_generic_to_shared(smem);
  bf16_t* xs = reinterpret_cast<bf16_t*>(smem + ((1024u - (s0 & 1023u)) & 1023u));
  __shared__ int src[BM], dst[BM];
  __shared__ float wrow[BM];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  int e, row0, cnt;
  if (!block_begin<BM, DOWN, PDL, THREADS>(e, row0, cnt, src, dst, wrow, meta, maxb, sorted, topk_w, N, k_top, tid))
    return;
  const int tin = blockIdx.x * WARPS + warp, tile = e * (R >> 4) + tin;
  const int nch = K >> 7;
  const uint4* lp = low + (size_t)tile * (K >> 5) * 32 + lane;  // chunk ch: + 128 ch
  const uint4* cp = codes + (size_t)tile * (K >> 6) * 32 + lane;  // + 64 ch
  uint4 w0[6], w1[6], w2[6];  // a chunk's 4 low and 2 code words of the thread; chunk ch in buffer ch % (DEPTH + 1)
  auto fetch = [&](uint4 (&w)[6], int ch) {
    if (ch < nch) {
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = __ldg(lp + ch * 128 + i * 32);
#pragma unroll
      for (int i = 0; i < 2; ++i) w[4 + i] = __ldg(cp + ch * 64 + i * 32);
    }
  };
  auto ahead = [&](int ch) {  // chunk ch's 2 KB of low bytes and 1 KB of codes into L2
    if (L2A > 0 && lane == 0 && ch < nch) {
      l2_prefetch(lp + ch * 128, 2048);
      l2_prefetch(cp + ch * 64, 1024);
    }
  };
  fetch(w0, 0);
  if (DEPTH == 2) fetch(w1, 1);
#pragma unroll
  for (int q = DEPTH; q < DEPTH + L2A; ++q) ahead(q);
  const unsigned int base4 = tile_base4(base, tile, g);
  __syncthreads();  // src
  load_x_swizzled<BM, THREADS>(xs, x, src, cnt, K, 0, tid);
  cp_async_commit();
  if (nch > 1) load_x_swizzled<BM, THREADS>(xs + BUF, x, src, cnt, K, 1, tid);
  cp_async_commit();
  float c[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
  float gs[GROWS];
#pragma unroll
  for (int q = 0; q < GROWS; ++q) gs[q] = 0.f;
  const bool gate = !DOWN && e == E && sgate;
  const int n16 = (cnt + 15) >> 4;
  // chunk ch from buffer cur, while chunk ch + DEPTH loads into nxt (chunk ch - 1's)
  auto step = [&](int ch, const uint4 (&cur)[6], uint4 (&nxt)[6]) {
    fetch(nxt, ch + DEPTH);
    ahead(ch + DEPTH + L2A);
    cp_async_wait<1>();  // chunk ch of x has landed (only ch + 1 may still be in flight)
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // ... for the tensor cores' reads too
    __syncthreads();  // ... for every thread's copies; and every warp is done with chunk ch - 1's buffer
    if (ch + 2 < nch) load_x_swizzled<BM, THREADS>(xs + (ch + 2) % 3 * BUF, x, src, cnt, K, ch + 2, tid);
    cp_async_commit();
    const bf16_t* xb = xs + (ch % 3) * BUF;
    const uint4 lo[4] = {cur[0], cur[1], cur[2], cur[3]}, cd[2] = {cur[4], cur[5]};
    unsigned int a[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) decode_step(lo, cd, base4, i, a[i]);
    wgmma_chunk<NT, BM>(c, a, (unsigned int)__cvta_generic_to_shared(xb), n16);
    if (gate) gate_chunk<BM, 0, true, GROWS, THREADS>(gs, xb, sgate, ch, cnt, tid);
  };
  ring_chunks<DEPTH>(nch, w0, w1, w2, step);
  if (gate) gate_finish<GROWS, THREADS>(wrow, gs, cnt, tid);
  tile_escapes<NT>(c, tile, x, K, src, eptr, ecol, edelta, cnt, g, t);
  __syncthreads();  // wrow
  tile_store<NT, DOWN>(c, tin, out, out_ld, dst, wrow, cnt, g, t);
}
"""
)
