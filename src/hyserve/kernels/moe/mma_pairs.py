"""The one-token MoE over the experts' fragment-ordered 12-bit copies (``--mma-experts``), on tensor cores: the
contracts of ``triton_pairs``' gate_up (with a given routing and the pre-norm inside) and down, with 0.75 of their
weight bytes. Each thread decodes its weights of a k16 step straight into ``mma.m16n8k16``'s A registers
(``kernels/mma_gemv``); the token's vector is the B operand (every column the same, column 0 read) from shared
memory.

``down_pairs_mma``: the down's expert ids come from the routing two launches back and its weights are no kernel's
output, so under PDL every CTA loads its ids and **all** of its weights into registers before its wait, while the
gate_up kernel finishes; only h (9 KB a token) and the residual load after it. At one token the whole down (9
experts x 2048 x 512, 14.2 MB in the format) is 128 CTAs of 110 KB, one an SM, one wave. CTA (tile, t) = output
rows [16 tile, + 16) of token t: warp w = j KSPLIT + ks takes slot j's expert (j < k: the token's routed expert j,
j = k: the shared expert) over its K slice ks of I. The warps' sums meet in shared memory and are added in warp
order (deterministic); a slot's escapes add ``delta * h[col]`` to their rows; the residual is added before the one
cast.

``gate_up_pairs_mma``: ``h[p] = w_p silu(x_n W_g[e_p]^T) (x_n W_u[e_p]^T)`` for the k routed pairs and the shared
expert (row k), x_n = rms_norm(x) rounded to bf16 (the unfused path's rounding), w_p the softmax of the token's
top-k raw logits (scaled by rstd and rounded through bf16, as the router's output is) rounded to bf16, the shared
expert's ``w = sigmoid(x_n . shared_expert_gate)``. The routing is the previous kernel's output, so a routed CTA
can load nothing of its expert before the wait (the 29th session's kernel of this contract lost there: one chunk
ahead a warp, its x norm in front of the stream, docs/performance.md 2026-12-06). Here: grid (2I / 16 tiles, k + 1
pairs), SPLIT warps a 16-row tile (8 gate + 8 up rows, ``mma_experts``' order) over K slices; right after its
expert id a warp requests DEPTH chunks of 8 k16 steps, then the CTA loads x and takes its norm while they are in
flight, and the loop keeps DEPTH chunks ahead in DEPTH + 1 register buffers (unrolled, no moves). The shared
expert's CTAs request theirs before the wait.
"""

from __future__ import annotations

import ctypes

import torch

from hyserve.kernels.contracts import require
from hyserve.kernels.moe.mma_experts import MmaExperts, unpack_mma_down, unpack_mma_experts
from hyserve.kernels.moe.mma_grouped_cuda import SOURCE as GROUPED_SOURCE
from hyserve.kernels.nvrtc import template_kernel
from hyserve.kernels.pdl import enabled as pdl_enabled
from hyserve.kernels.rmsnorm.reference import rms_norm_reference

# the largest token count the decode path routes to the down kernel (0: none), and the K split of a slot's 16-row
# tile (warps a slot)
MAX_TOKENS = 1
KSPLIT = 2
KSPLITS = (1, 2)
# the gate_up kernel's tiles, (SPLIT warps a tile, DEPTH chunks ahead a warp); None: the decode path keeps the Triton
# gate_up. H100, 2026-12-06 (docs/performance.md): (2, 2) and (2, 1) best; more warps a tile, or a warp's first
# chunks staged through shared memory by cp.async (more bytes in flight), were slower
GATE_UP_TILES: tuple[int, int] | None = (2, 2)

SOURCE = (
    GROUPED_SOURCE
    + r"""
__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
  const unsigned int x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s += bf16_lo(x[i]) * bf16_lo(y[i]);
    s += bf16_hi(x[i]) * bf16_hi(y[i]);
  }
  return s;
}

// grid (2I / 16 tiles, k + 1 pairs), 32 SPLIT threads; pair k is the shared expert (expert E of the packed matrix);
// h [k + 1, I]; ids [k], raw [k] (the top-k raw logits, before rstd)
template <int SPLIT, int DEPTH, bool PDL>
__global__ void __launch_bounds__(32 * SPLIT) gate_up_pairs_mma(
    bf16_t* __restrict__ h, const bf16_t* __restrict__ x, const bf16_t* __restrict__ nw, float eps,
    const int* __restrict__ ids, const float* __restrict__ raw, const bf16_t* __restrict__ sgate,
    const uint4* __restrict__ low, const uint4* __restrict__ codes, const int* __restrict__ base,
    const int* __restrict__ eptr, const int* __restrict__ ecol, const float* __restrict__ edelta, int K, int I, int E,
    int k_top) {
  static_assert(DEPTH == 1 || DEPTH == 2, "one or two chunks ahead");
  extern __shared__ uint4 xn_s[];  // [K / 8]: x_n, bf16 (its own name: the sources share a unit)
  __shared__ float part[SPLIT][16];
  __shared__ float red[SPLIT], red2[SPLIT], rows[16];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int p = blockIdx.y, nch = (K >> 7) / SPLIT, s0 = warp * nch * 8, S = K >> 4;
  const bool shared = p == k_top;
  const uint4 *lp, *cp;
  uint4 w0[6], w1[6], w2[6];  // a chunk's 4 low and 2 code words of the thread; chunk ch in buffer ch % (DEPTH + 1)
  auto fetch = [&](uint4 (&w)[6], int ch) {
    if (ch < nch) {
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = __ldg(lp + ch * 128 + i * 32);
#pragma unroll
      for (int i = 0; i < 2; ++i) w[4 + i] = __ldg(cp + ch * 64 + i * 32);
    }
  };
  unsigned int base4;
  int tile;
  RowEscapes esc;
  // expert e's tile: its first chunks requested, its rows' windows and (threads < 16) escape ranges
  auto start = [&](int e) {
    tile = e * ((2 * I) >> 4) + blockIdx.x;
    lp = low + ((size_t)tile * (S >> 1) + (s0 >> 1)) * 32 + lane;
    cp = codes + ((size_t)tile * (S >> 2) + (s0 >> 2)) * 32 + lane;
    fetch(w0, 0);
    if (DEPTH == 2) fetch(w1, 1);
    base4 = tile_base4(base, tile, g);
    if (tid < 16) esc.range(eptr, tile * 16 + tid);
  };
  // the norm weight's and (shared expert) the shared gate's words a thread applies, all at K = 2048: weights, so
  // before the wait
  constexpr int NWR = NORM_WORDS<SPLIT>;
  NormWords<NWR> nwr, sgw;
  nwr.template load<SPLIT>(nw, true, K, tid);
  sgw.template load<SPLIT>(sgate, shared && sgate, K, tid);
  if (shared) start(E);
  if (PDL) pdl_wait();
  // the routing, the previous kernel's output: lane q's raw logit q (one load a lane, beside the id's), the id
  const float rawv = !shared && lane < k_top ? __ldcg(raw + lane) : 0.f;
  if (!shared) start(__ldcg(ids + p));
  const float rstd = load_x<SPLIT, NWR>(xn_s, x, nw, true, eps, K, red, tid, warp, lane, nwr);
  esc.first(ecol, edelta);  // threads < 16: their row's first escape, landing during the ring instead of after it
  float wrow = 1.f;
  if (shared) {
    if (sgate) {
      const uint4* s4 = reinterpret_cast<const uint4*>(sgate);
      float dot = 0.f;
#pragma unroll
      for (int j = 0; j < NWR; ++j) {
        const int i = tid + j * 32 * SPLIT;
        if (i < (K >> 3)) dot += dot8(xn_s[i], sgw.v[j]);
      }
      for (int i = tid + NWR * 32 * SPLIT; i < (K >> 3); i += 32 * SPLIT) dot += dot8(xn_s[i], __ldg(s4 + i));
      wrow = 1.f / (1.f + __expf(-block_sum<SPLIT>(dot, red2, warp, lane)));
    }
  } else {  // softmax of the top-k logits scaled by rstd, each rounded through bf16 like the router's output; the
            // logits pass between lanes in order q = 0, 1, ... (the sums' order of the reference loop)
    const float zl = bf16_lo(pack_bf16x2(rawv * rstd, 0.f));
    float mx = __int_as_float(0xff800000), num = 0.f, den = 0.f;
    for (int q = 0; q < k_top; ++q) mx = fmaxf(mx, __shfl_sync(0xFFFFFFFFu, zl, q));
    for (int q = 0; q < k_top; ++q) {
      const float z = __expf(__shfl_sync(0xFFFFFFFFu, zl, q) - mx);
      den += z;
      if (q == p) num = z;
    }
    wrow = bf16_lo(pack_bf16x2(num / den, 0.f));
  }
  __syncthreads();  // xn_s normalised
  const unsigned int* x2 = reinterpret_cast<const unsigned int*>(xn_s);
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  // chunk ch from buffer cur, while chunk ch + DEPTH loads into nxt (chunk ch - 1's)
  auto step = [&](int ch, const uint4 (&cur)[6], uint4 (&nxt)[6]) {
    fetch(nxt, ch + DEPTH);
    const uint4 lo[4] = {cur[0], cur[1], cur[2], cur[3]}, cd[2] = {cur[4], cur[5]};
    chunk_mma(c, lo, cd, base4, x2, (s0 + ch * 8) * 8, t);
  };
  ring_chunks<DEPTH>(nch, w0, w1, w2, step);
  if (t == 0) {
    part[warp][g] = c[0];
    part[warp][g + 8] = c[2];
  }
  __syncthreads();
  if (tid < 16) {
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < SPLIT; ++w) acc += part[w][tid];
    rows[tid] = esc.add(acc, reinterpret_cast<const bf16_t*>(xn_s), ecol, edelta);
  }
  __syncthreads();
  if (tid < 8) {  // row tid of the tile is gate i, row tid + 8 up i, i = 8 blockIdx.x + tid
    const float gv = rows[tid], uv = rows[tid + 8];
    h[(size_t)p * I + 8 * blockIdx.x + tid] = to_bf16(gv / (1.f + __expf(-gv)) * uv * wrow);
  }
}
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
  RowEscapes esc;
  if (ks == 0 && lane < 16) {  // lane r: the escapes of the slot's row r
    esc.range(eptr, ptile * 16 + lane);
    esc.first(ecol, edelta);
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
  for (int ch = 0; ch < NCH; ++ch) chunk_mma(c, lo[ch], cd[ch], base4, h2, (s0 + ch * 8) * 8, t);
  if (t == 0) {
    part[warp][g] = c[0];
    part[warp][g + 8] = c[2];
  }
  __syncwarp();
  // -0 + d = d for every d: the corrections' sum alone, then added to the warp's part
  if (esc.beg < esc.end) part[warp][lane] += esc.add(-0.f, reinterpret_cast<const bf16_t*>(hs[j]), ecol, edelta);
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

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_PARAMS = (_P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I)
_GATE_UP_PARAMS = (_P, _P, _P, _F, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I)


def gate_up_pairs_mma_takes(packed: object, x: torch.Tensor, topk_ids: torch.Tensor | None) -> bool:
    """Whether the decode path routes this gate_up here: GATE_UP_TILES set, the experts' copy, one bf16 token with
    int32 ids (a given routing: raw logits and the pre-norm inside), H a multiple of 128 SPLIT."""
    if GATE_UP_TILES is None or not isinstance(packed, MmaExperts) or topk_ids is None:
        return False
    H = packed.gate_up.shape[1]
    return (
        x.dtype == torch.bfloat16
        and x.shape == (1, H)
        and topk_ids.dtype == torch.int32
        and topk_ids.shape[0] == 1
        and H % (128 * GATE_UP_TILES[0]) == 0
    )


def gate_up_pairs_mma_reference(
    x: torch.Tensor,
    packed: MmaExperts,
    topk_ids: torch.Tensor,
    raw_logits: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_eps: float,
    shared_expert_gate: torch.Tensor | None,
) -> torch.Tensor:
    """x [1, H] (the block's input before its pre-norm), topk_ids [1, k] int32, raw_logits [1, k] fp32 (before
    rstd) -> h [k + 1, I] in x's dtype (``gate_up_pairs_mma``'s contract; the module says what h is), in fp32 from
    the unpacked weights."""
    w, shared = unpack_mma_experts(packed)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + norm_eps)  # [1]
    xn = rms_norm_reference(x, norm_weight, norm_eps).float()[0]  # [H], rounded to x's dtype
    logits = (raw_logits.float()[0] * rstd).to(x.dtype).float()
    weights = torch.softmax(logits, dim=0).to(x.dtype).float()
    gu = torch.cat([w[topk_ids[0].long()], shared[None]]).float() @ xn  # [k + 1, 2I]
    if shared_expert_gate is not None:
        sw = torch.sigmoid(xn @ shared_expert_gate.float().reshape(-1))[None]
    else:
        sw = torch.ones(1, device=x.device)
    g, u = gu[:, : packed.inter], gu[:, packed.inter :]
    return (g / (1.0 + torch.exp(-g)) * u * torch.cat([weights, sw])[:, None]).to(x.dtype)


def gate_up_pairs_mma(
    x: torch.Tensor,
    packed: MmaExperts,
    topk_ids: torch.Tensor,
    raw_logits: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_eps: float,
    shared_expert_gate: torch.Tensor | None,
    tiles: tuple[int, int] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """See ``gate_up_pairs_mma_reference``: x [1, H] bf16 CUDA -> h [k + 1, I] bf16 (into ``out``). ``tiles``:
    (SPLIT, DEPTH), else GATE_UP_TILES."""
    split, depth = tiles or GATE_UP_TILES or (2, 2)
    H, k = packed.gate_up.shape[1], topk_ids.shape[1]
    require(
        x.dtype == torch.bfloat16 and x.is_cuda and x.is_contiguous() and x.shape == (1, H),
        f"gate_up_pairs_mma takes one contiguous bf16 CUDA token [1, {H}], got {x.dtype} {tuple(x.shape)}",
    )
    require(
        k <= 32 and topk_ids.shape == (1, k) and topk_ids.dtype == torch.int32 and topk_ids.is_contiguous()
        and raw_logits.shape == (1, k) and raw_logits.dtype == torch.float32 and raw_logits.is_contiguous(),
        "gate_up_pairs_mma takes contiguous int32 topk_ids and fp32 raw logits [1, k], k <= 32",
    )  # fmt: skip
    require(
        norm_weight.shape == (H,) and norm_weight.dtype == torch.bfloat16 and norm_weight.is_contiguous(),
        f"gate_up_pairs_mma: the norm weight must be bf16 [{H}]",
    )
    require(
        split in (2, 4, 8) and depth in (1, 2) and H % (128 * split) == 0,
        f"gate_up_pairs_mma: SPLIT {split} must be 2, 4 or 8 and divide H = {H} in chunks of 128, DEPTH 1 or 2 "
        f"(got {depth})",
    )
    sg = None
    if shared_expert_gate is not None:
        sg = shared_expert_gate.reshape(-1)
        require(sg.numel() == H and sg.is_contiguous(), "gate_up_pairs_mma: the shared gate must be [H]")
    if out is None:
        out = torch.empty((k + 1, packed.inter), device=x.device, dtype=x.dtype)
    p, pdl = packed.gate_up, pdl_enabled(x)
    template_kernel(SOURCE, "gate_up_pairs_mma", (split, depth, pdl), _GATE_UP_PARAMS, x.device).launch(
        (2 * packed.inter // 16, k + 1),
        32 * split,
        (out, x, norm_weight, float(norm_eps), topk_ids, raw_logits, sg, p.low, p.codes, p.base, p.escape_ptr,
         p.escape_col, p.escape_delta, H, packed.inter, packed.num_experts, k),
        shared_mem=2 * H,
        pdl=pdl,
    )  # fmt: skip
    return out


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
