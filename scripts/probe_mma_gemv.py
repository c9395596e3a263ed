"""Probe: the batch-1 GEMV hand-written on mma.sync, over bf16 and over the 12-bit format in fragment order.

The Triton GEMV over the 12-bit format (``kernels/packed_bf16``) lost to the bf16 plan because it is bound by
instructions (69 a 8-element group; docs/performance.md, "Lossless 12-bit weights"), and Triton's tensor-core
forms of it lost by their tiles. Here the format is laid out at pack time in the order of ``mma.m16n8k16``'s A
fragment, so a thread's 8 weights of one k16 step are 8 low bytes and one 32-bit word of codes, decoded into
the four A registers with 8 integer ops and 4 ``prmt`` (~2 instructions an element), and x is the B operand
(every column the same x, column 0 of C read). A CTA takes 16 rows; its SPLIT warps split K and reduce in
shared memory (fixed order). The same kernel over bf16 fragments (16 bytes a thread a step) is the control:
whether hand-written code streams better than the Triton plan, and what the format gives on top.

``python scripts/probe_mma_gemv.py check``: the layout and decode emulated in torch (CPU or GPU), exact
against ``unpack_bf16``. ``bench`` (GPU; compiles the CUDA source with ``torch.utils.cpp_extension``): every
kernel against the fp64 product, then per shape cuBLAS, the Triton plan, and the two CUDA kernels at SPLIT
2-16, with and without PDL, each a CUDA graph of 40 launches over weight copies that overflow the L2.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from hyserve.kernels.packed_bf16 import decoded_bits, pack_bf16

# fragment element j (0..7) of lane (g, t) at a k16 step: row g or g + 8, column 2t (+1) or 2t + 8 (+1)
_J = torch.arange(8)
_L = torch.arange(32)
FRAG_ROW = (_L[:, None] >> 2) + 8 * ((_J[None, :] >> 1) & 1)  # [32, 8]
FRAG_COL = 2 * (_L[:, None] & 3) + (_J[None, :] & 1) + 8 * (_J[None, :] >> 2)  # [32, 8]


def to_fragments(m: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [N/16, K/16, 32, 8]: element j of lane l at (tile, step) is m[16 tile + FRAG_ROW, 16 step + FRAG_COL]."""
    n, k = m.shape
    t = m.reshape(n // 16, 16, k // 16, 16).permute(0, 2, 1, 3)  # [T, S, 16, 16]
    return t[:, :, FRAG_ROW.to(m.device), FRAG_COL.to(m.device)]


def from_fragments(f: torch.Tensor) -> torch.Tensor:
    tiles, steps = f.shape[:2]
    out = torch.empty(tiles, steps, 16, 16, dtype=f.dtype, device=f.device)
    out[:, :, FRAG_ROW.to(f.device), FRAG_COL.to(f.device)] = f
    return out.permute(0, 2, 1, 3).reshape(tiles * 16, steps * 16)


class FragPacked:
    """A bf16 [N, K] in the 12-bit format (``pack_bf16``'s windows and escapes), laid out for the kernel:
    ``low`` uint8 [T, S/2, 32, 16] (a thread's 16-byte load: steps 2p and 2p+1, 8 bytes each), ``codes`` int32
    [T, S/4, 32, 4] (a 16-byte load: 4 steps; word byte j holds element j's code low, j+4's high), ``base`` [N]
    int32, escapes as row pointers, columns and ``w - v'`` (the true value less what the codes decode to)."""

    def __init__(self, w: torch.Tensor) -> None:
        n, k = w.shape
        p = pack_bf16(w)
        nib = p.nib.to(torch.int64)
        code = torch.stack((nib & 15, nib >> 4), dim=2).flatten(1)  # [N, K]
        tiles, steps = n // 16, k // 16
        lf = to_fragments(p.low)  # [T, S, 32, 8]
        self.low = (
            lf.reshape(tiles, steps // 2, 2, 32, 8).permute(0, 1, 3, 2, 4).reshape(tiles, steps // 2, 32, 16)
        )
        self.low = self.low.contiguous()
        cf = to_fragments(code)  # [T, S, 32, 8]
        words = (cf[..., :4] | (cf[..., 4:] << 4)).to(torch.uint8).contiguous().view(torch.int32)[..., 0]
        self.codes = words.reshape(tiles, steps // 4, 4, 32).permute(0, 1, 3, 2).contiguous()
        self.base = p.base.contiguous()
        e = p.escapes
        rows, cols = p.escape_row[:e].long(), p.escape_col[:e].long()
        stored = decoded_bits(p.low[rows, cols].long(), code[rows, cols], p.base[rows].long())
        stored = ((stored ^ 0x8000) - 0x8000).to(torch.int16).view(torch.bfloat16).float()
        self.eptr = p.escape_ptr
        self.ecol = p.escape_col
        self.edelta = torch.cat((p.escape_val[:e] - stored, p.escape_val[e:]))
        self.escapes = e
        self.shape = (n, k)
        self.nbytes = sum(t.numel() * t.element_size() for t in (self.low, self.codes, self.base, self.eptr))
        self.nbytes += 8 * e


def _u32(b: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 4] -> int64 [...]: the little-endian 32-bit word."""
    b = b.to(torch.int64)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def _prmt(a: torch.Tensor, b: torch.Tensor, sel: int) -> torch.Tensor:
    """PTX prmt.b32 (default mode) on int64 words: byte i of the result is byte (sel >> 4i) & 7 of {b, a}."""
    out = torch.zeros_like(a)
    for i in range(4):
        s = (sel >> (4 * i)) & 7
        src = a if s < 4 else b
        out |= ((src >> (8 * (s & 3))) & 0xFF) << (8 * i)
    return out


def emulate_decode(fp: FragPacked) -> torch.Tensor:
    """What the kernel's threads put in their A registers, by its own indexing of the flat buffers, as the
    bf16 matrix [N, K] before the escapes' corrections."""
    n, k = fp.shape
    tiles, steps = n // 16, k // 16
    tt, ss, ll = torch.meshgrid(torch.arange(tiles), torch.arange(steps), torch.arange(32), indexing="ij")
    tt, ss, ll = (x.to(fp.low.device) for x in (tt, ss, ll))
    low16 = fp.low.reshape(-1, 16)
    lidx = (tt * (steps // 2) + ss // 2) * 32 + ll
    lb = low16[lidx]  # [T, S, 32, 16]
    half = (ss % 2)[..., None] * 8 + torch.arange(8, device=lb.device)
    lb = torch.gather(lb, 3, half.expand(*lb.shape[:3], 8))
    l0, l1 = _u32(lb[..., :4]), _u32(lb[..., 4:])
    cidx = (tt * (steps // 4) + ss // 4) * 32 + ll
    w = fp.codes.reshape(-1, 4)[cidx]  # [T, S, 32, 4]
    w = torch.gather(w, 3, (ss % 4)[..., None]).squeeze(-1).to(torch.int64) & 0xFFFFFFFF
    g = ll >> 2
    bg = fp.base.to(torch.int64)[tt * 16 + g]
    bg8 = fp.base.to(torch.int64)[tt * 16 + g + 8]
    base4 = bg | (bg << 8) | (bg8 << 16) | (bg8 << 24)
    ca, cb = w & 0x0F0F0F0F, (w >> 4) & 0x0F0F0F0F
    ha = ((ca & 0x07070707) + base4) | ((ca << 4) & 0x80808080)
    hb = ((cb & 0x07070707) + base4) | ((cb << 4) & 0x80808080)
    regs = [_prmt(l0, ha, 0x5140), _prmt(l0, ha, 0x7362), _prmt(l1, hb, 0x5140), _prmt(l1, hb, 0x7362)]
    halves = []
    for r in regs:
        halves += [r & 0xFFFF, r >> 16]
    bits = torch.stack(halves, dim=-1)  # [T, S, 32, 8], element j in register j // 2, half j % 2
    vals = ((bits ^ 0x8000) - 0x8000).to(torch.int16).view(torch.bfloat16)
    return from_fragments(vals)


def check(n: int, k: int, device: str) -> None:
    torch.manual_seed(0)
    w = (torch.randn(n, k, device=device) * 0.02).to(torch.bfloat16)
    w[0, :7] = 0.0  # exact zeros and a far-off value: escapes
    w[3, 5] = 3.0
    fp = FragPacked(w)
    dec = emulate_decode(fp)
    e = fp.escapes
    fixed = dec.float()
    rows = torch.repeat_interleave(torch.arange(n, device=device), (fp.eptr[1:] - fp.eptr[:-1]).long())
    fixed[rows, fp.ecol[:e].long()] += fp.edelta[:e]
    ok_dec = torch.equal(fixed.to(torch.bfloat16).view(torch.int16), w.view(torch.int16))
    wf = to_fragments(w)
    ok_frag = torch.equal(from_fragments(wf).view(torch.int16), w.view(torch.int16))
    print(
        f"check {n}x{k} on {device}: escapes {e}, decode + escapes exact: {ok_dec}, fragments round-trip: {ok_frag}"
    )
    if not (ok_dec and ok_frag):
        raise SystemExit(1)


CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <bool PDL>
__device__ __forceinline__ void pdl_wait_release() {
  if (PDL) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
  }
}

// x [K] bf16 into shared memory (L2-coherent loads: the previous kernel wrote it)
__device__ __forceinline__ void load_x(uint4* xs, const __nv_bfloat16* x, int K, int tid, int nthreads) {
  const uint4* x4 = reinterpret_cast<const uint4*>(x);
  for (int i = tid; i < (K >> 3); i += nthreads) xs[i] = __ldcg(x4 + i);
}

__device__ __forceinline__ void decode8(uint32_t L0, uint32_t L1, uint32_t w, uint32_t base4, uint32_t& a0,
                                        uint32_t& a1, uint32_t& a2, uint32_t& a3) {
  const uint32_t ca = w & 0x0F0F0F0Fu, cb = (w >> 4) & 0x0F0F0F0Fu;
  const uint32_t ha = ((ca & 0x07070707u) + base4) | ((ca << 4) & 0x80808080u);
  const uint32_t hb = ((cb & 0x07070707u) + base4) | ((cb << 4) & 0x80808080u);
  a0 = __byte_perm(L0, ha, 0x5140);
  a1 = __byte_perm(L0, ha, 0x7362);
  a2 = __byte_perm(L1, hb, 0x5140);
  a3 = __byte_perm(L1, hb, 0x7362);
}

template <int SPLIT>
__device__ __forceinline__ float reduce_rows(float (&c)[4], float (*part)[16], int warp, int g, int t, int tid) {
  if (t == 0) {
    part[warp][g] = c[0];
    part[warp][g + 8] = c[2];
  }
  __syncthreads();
  float acc = 0.f;
  if (tid < 16) {
#pragma unroll
    for (int w = 0; w < SPLIT; ++w) acc += part[w][tid];
  }
  return acc;
}

// low: [T][S/2][32] uint4, codes: [T][S/4][32] uint4; one CTA a 16-row tile, SPLIT warps over K
template <int SPLIT, bool PDL>
__global__ void __launch_bounds__(32 * SPLIT) gemv_packed_kernel(
    __nv_bfloat16* __restrict__ y, const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ low,
    const uint4* __restrict__ codes, const int32_t* __restrict__ base, const int32_t* __restrict__ eptr,
    const int32_t* __restrict__ ecol, const float* __restrict__ edelta, int K) {
  extern __shared__ uint4 xs[];
  __shared__ float part[SPLIT][16];
  const int tile = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int S = K >> 4, SW = S / SPLIT, s0 = warp * SW, nch = SW >> 3;
  const uint4* lp = low + ((size_t)tile * (S >> 1) + (s0 >> 1)) * 32 + lane;
  const uint4* cp = codes + ((size_t)tile * (S >> 2) + (s0 >> 2)) * 32 + lane;
  uint4 lo[4], cd[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) lo[i] = __ldg(lp + i * 32);
#pragma unroll
  for (int i = 0; i < 2; ++i) cd[i] = __ldg(cp + i * 32);
  const int r0 = tile * 16;
  const uint32_t bg = (uint32_t)__ldg(base + r0 + g), bg8 = (uint32_t)__ldg(base + r0 + g + 8);
  const uint32_t base4 = bg | (bg << 8) | (bg8 << 16) | (bg8 << 24);
  int e_beg = 0, e_end = 0;
  if (tid < 16) {
    e_beg = __ldg(eptr + r0 + tid);
    e_end = __ldg(eptr + r0 + tid + 1);
  }
  pdl_wait_release<PDL>();
  load_x(xs, x, K, tid, 32 * SPLIT);
  int e_col0 = 0;
  float e_d0 = 0.f;
  if (e_beg < e_end) {
    e_col0 = __ldg(ecol + e_beg);
    e_d0 = __ldg(edelta + e_beg);
  }
  __syncthreads();
  const uint32_t* x2 = reinterpret_cast<const uint32_t*>(xs);
  float c[4] = {0.f, 0.f, 0.f, 0.f};
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
    const int xb = (s0 + ch * 8) * 8;  // u32 index of the chunk's first x pair
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint4 v = lo[i >> 1];
      const uint32_t L0 = (i & 1) ? v.z : v.x, L1 = (i & 1) ? v.w : v.y;
      const uint4 cw = cd[i >> 2];
      const uint32_t w = (i & 3) == 0 ? cw.x : (i & 3) == 1 ? cw.y : (i & 3) == 2 ? cw.z : cw.w;
      uint32_t a0, a1, a2, a3;
      decode8(L0, L1, w, base4, a0, a1, a2, a3);
      mma_bf16(c, a0, a1, a2, a3, x2[xb + i * 8 + t], x2[xb + i * 8 + t + 4]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) lo[i] = lo_n[i];
#pragma unroll
    for (int i = 0; i < 2; ++i) cd[i] = cd_n[i];
  }
  float acc = reduce_rows<SPLIT>(c, part, warp, g, t, tid);
  if (tid < 16) {
    const __nv_bfloat16* xh = reinterpret_cast<const __nv_bfloat16*>(xs);
    if (e_beg < e_end) {
      acc += e_d0 * __bfloat162float(xh[e_col0]);
      for (int e = e_beg + 1; e < e_end; ++e) acc += __ldg(edelta + e) * __bfloat162float(xh[__ldg(ecol + e)]);
    }
    y[r0 + tid] = __float2bfloat16(acc);
  }
}

// wf: [T][S][32] uint4 (a thread's A registers of one k16 step)
template <int SPLIT, bool PDL>
__global__ void __launch_bounds__(32 * SPLIT) gemv_bf16_kernel(
    __nv_bfloat16* __restrict__ y, const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ wf, int K) {
  extern __shared__ uint4 xs[];
  __shared__ float part[SPLIT][16];
  const int tile = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int S = K >> 4, SW = S / SPLIT, s0 = warp * SW, nch = SW >> 3;
  const uint4* wp = wf + ((size_t)tile * S + s0) * 32 + lane;
  uint4 cur[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) cur[i] = __ldg(wp + i * 32);
  pdl_wait_release<PDL>();
  load_x(xs, x, K, tid, 32 * SPLIT);
  __syncthreads();
  const uint32_t* x2 = reinterpret_cast<const uint32_t*>(xs);
  float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 1
  for (int ch = 0; ch < nch; ++ch) {
    uint4 nxt[8];
    if (ch + 1 < nch) {
      wp += 8 * 32;
#pragma unroll
      for (int i = 0; i < 8; ++i) nxt[i] = __ldg(wp + i * 32);
    }
    const int xb = (s0 + ch * 8) * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      mma_bf16(c, cur[i].x, cur[i].y, cur[i].z, cur[i].w, x2[xb + i * 8 + t], x2[xb + i * 8 + t + 4]);
#pragma unroll
    for (int i = 0; i < 8; ++i) cur[i] = nxt[i];
  }
  float acc = reduce_rows<SPLIT>(c, part, warp, g, t, tid);
  if (tid < 16) y[tile * 16 + tid] = __float2bfloat16(acc);
}

template <typename... KArgs, typename... Args>
static void launch(void (*kernel)(KArgs...), int grid, int block, size_t smem, bool pdl, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = at::cuda::getCurrentCUDAStream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

#define DISPATCH(SPLITV, BODY)                                              \
  switch (SPLITV) {                                                         \
    case 2: { constexpr int SP = 2; BODY; break; }                          \
    case 4: { constexpr int SP = 4; BODY; break; }                          \
    case 8: { constexpr int SP = 8; BODY; break; }                          \
    case 16: { constexpr int SP = 16; BODY; break; }                        \
    default: TORCH_CHECK(false, "split must be 2, 4, 8 or 16");             \
  }

void gemv_packed(torch::Tensor y, torch::Tensor x, torch::Tensor low, torch::Tensor codes, torch::Tensor base,
                 torch::Tensor eptr, torch::Tensor ecol, torch::Tensor edelta, int64_t split, bool pdl) {
  const int N = y.size(0), K = x.size(0);
  TORCH_CHECK(N % 16 == 0 && K % (128 * split) == 0, "shape");
  auto yp = reinterpret_cast<__nv_bfloat16*>(y.data_ptr());
  auto xp = reinterpret_cast<const __nv_bfloat16*>(x.data_ptr());
  auto lp = reinterpret_cast<const uint4*>(low.data_ptr());
  auto cp = reinterpret_cast<const uint4*>(codes.data_ptr());
  auto bp = base.data_ptr<int32_t>();
  auto ep = eptr.data_ptr<int32_t>();
  auto ec = ecol.data_ptr<int32_t>();
  auto ed = edelta.data_ptr<float>();
  DISPATCH(split, {
    if (pdl) launch(gemv_packed_kernel<SP, true>, N / 16, 32 * SP, K * 2, true, yp, xp, lp, cp, bp, ep, ec, ed, K);
    else launch(gemv_packed_kernel<SP, false>, N / 16, 32 * SP, K * 2, false, yp, xp, lp, cp, bp, ep, ec, ed, K);
  });
}

void gemv_bf16(torch::Tensor y, torch::Tensor x, torch::Tensor wf, int64_t split, bool pdl) {
  const int N = y.size(0), K = x.size(0);
  TORCH_CHECK(N % 16 == 0 && K % (128 * split) == 0, "shape");
  auto yp = reinterpret_cast<__nv_bfloat16*>(y.data_ptr());
  auto xp = reinterpret_cast<const __nv_bfloat16*>(x.data_ptr());
  auto wp = reinterpret_cast<const uint4*>(wf.data_ptr());
  DISPATCH(split, {
    if (pdl) launch(gemv_bf16_kernel<SP, true>, N / 16, 32 * SP, K * 2, true, yp, xp, wp, K);
    else launch(gemv_bf16_kernel<SP, false>, N / 16, 32 * SP, K * 2, false, yp, xp, wp, K);
  });
}
"""

CPP_DECL = r"""
#include <torch/extension.h>
void gemv_packed(torch::Tensor y, torch::Tensor x, torch::Tensor low, torch::Tensor codes, torch::Tensor base,
                 torch::Tensor eptr, torch::Tensor ecol, torch::Tensor edelta, int64_t split, bool pdl);
void gemv_bf16(torch::Tensor y, torch::Tensor x, torch::Tensor wf, int64_t split, bool pdl);
"""


def build():
    from torch.utils.cpp_extension import load_inline

    return load_inline(
        name="probe_mma_gemv",
        cpp_sources=CPP_DECL,
        cuda_sources=CUDA_SRC,
        functions=["gemv_packed", "gemv_bf16"],
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas=-v"],
        verbose=True,
    )


def graph_us(calls, reps: int = 7) -> float:
    """Median us a call of a CUDA graph holding ``calls`` (a list of thunks) back to back."""
    for c in calls[:2]:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for c in calls:
                c()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(calls))
    return statistics.median(times[1:])


def _bench_shape(ext, n: int, k: int, launches: int) -> list[dict]:
    import os

    from hyserve.kernels.linear import linear

    dev = "cuda"
    torch.manual_seed(0)
    bf16_bytes = n * k * 2
    copies = max(2, min(launches, (768 << 20) // bf16_bytes))
    ws = [(torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16) for _ in range(copies)]
    x = torch.randn(k, device=dev).to(torch.bfloat16)
    fps = [FragPacked(w) for w in ws]
    wfs = [to_fragments(w).contiguous() for w in ws]
    y = torch.empty(n, device=dev, dtype=torch.bfloat16)
    ref = (ws[0].double() @ x.double()).float()
    splits = [sp for sp in (2, 4, 8, 16) if k % (128 * sp) == 0]

    def err(out: torch.Tensor) -> float:
        return ((out.float() - ref).norm() / ref.norm()).item()

    def bf16_call(i: int, sp: int, pdl: bool):
        return lambda: ext.gemv_bf16(y, x, wfs[i], sp, pdl)

    def packed_call(i: int, sp: int, pdl: bool):
        f = fps[i]
        return lambda: ext.gemv_packed(y, x, f.low, f.codes, f.base, f.eptr, f.ecol, f.edelta, sp, pdl)

    checks = {"torch": err(ws[0] @ x), "triton": err(linear(x[None], ws[0])[0])}
    for sp in splits:
        y.fill_(float("nan"))
        bf16_call(0, sp, False)()
        checks[f"bf16 s{sp}"] = err(y)
        yb = y.clone()
        y.fill_(float("nan"))
        packed_call(0, sp, False)()
        checks[f"packed s{sp}"] = err(y)
        checks[f"packed-bf16 s{sp} maxabs"] = (y.float() - yb.float()).abs().max().item()
    print(
        f"{n}x{k}: escapes {fps[0].escapes}, packed {fps[0].nbytes / bf16_bytes:.3f} of the bf16 bytes; errors:"
    )
    print("  " + ", ".join(f"{key} {v:.2e}" for key, v in checks.items()))
    torch.cuda.synchronize()
    rows = []

    def add(name: str, calls: list, nbytes: int) -> None:
        us = graph_us(calls)
        rows.append(dict(shape=f"{n}x{k}", kernel=name, us=us, TBps=nbytes / us / 1e6))

    order = [i % copies for i in range(launches)]
    add("cublas", [lambda i=i: torch.mv(ws[i], x, out=y) for i in order], bf16_bytes)
    for pdl in ("0", "1"):
        os.environ["HYSERVE_PDL"] = pdl
        add(f"triton plan pdl{pdl}", [lambda i=i: linear(x[None], ws[i]) for i in order], bf16_bytes)
    os.environ["HYSERVE_PDL"] = "1"
    for sp in splits:
        for pdl in (False, True):
            add(f"cuda bf16 s{sp} pdl{int(pdl)}", [bf16_call(i, sp, pdl) for i in order], bf16_bytes)
            add(f"cuda packed s{sp} pdl{int(pdl)}", [packed_call(i, sp, pdl) for i in order], fps[0].nbytes)
    return rows


def bench(shapes: list[tuple[int, int]], launches: int) -> None:
    ext = build()
    rows = []
    for n, k in shapes:
        rows += _bench_shape(ext, n, k, launches)
        torch.cuda.empty_cache()
    print(f"\n{'shape':>10} {'kernel':>22} {'us':>7} {'TB/s':>6}")
    for r in rows:
        print(f"{r['shape']:>10} {r['kernel']:>22} {r['us']:7.2f} {r['TBps']:6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("check", "bench"))
    ap.add_argument("--shapes", default="12352x2048,9216x2048,2048x4096")
    ap.add_argument("--launches", type=int, default=40)
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.what == "check":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        check(64, 256, dev)
        check(*shapes[0], dev) if dev == "cuda" else check(256, 2048, dev)
    else:
        bench(shapes, args.launches)


if __name__ == "__main__":
    main()
