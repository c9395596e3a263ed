"""The one-token MoE gate_up over the experts' fragment-ordered 12-bit copies, on tensor cores (an optional
path: ``layers/mma_projections.py`` makes the copies with ``--mma-experts``).

``gate_up_mma`` computes what ``triton_pairs.gate_up_pairs`` does for one token with a given routing (the
top-k ids and raw logits of ``kernels/routed_projection``) and the pre-norm applied inside: ``h[p] = w_p
silu(x_n W_g[e_p]^T) (x_n W_u[e_p]^T)`` for the k routed pairs and the shared expert (row k), with ``x_n =
rms_norm(x)`` rounded to bf16 (the unfused path's rounding), ``w_p`` the softmax of the token's top-k logits
(scaled by rstd and rounded through bf16, as the router's output is) rounded to bf16, and the shared expert's
``w = sigmoid(x_n . shared_expert_gate)``. The down kernel (``down_pairs``) then takes h as it takes the Triton
kernel's.

Layout (``pack_mma_experts``): each expert's [2I, H] gate_up rows reordered so that every 16-row tile holds 8
gate rows and the 8 up rows of the same intermediate indices (rows ``8j .. 8j+7`` of gate, then of up), the
shared expert appended as expert E, and the whole [(E + 1) 2I, H] matrix packed by ``mma_gemv.pack_mma``. A CTA
takes one tile of one pair: its expert id after the PDL wait (the routing wrote it; the shared expert's CTAs load
their first weights before it), the kernel of ``mma_gemv`` for the products, and its first 8 threads end with
the tile's 8 values of h.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from hyserve.kernels.contracts import require
from hyserve.kernels.mma_gemv import MmaPackedBF16, pack_mma, unpack_mma
from hyserve.kernels.mma_gemv.cuda_kernel import HELPERS, SPLITS
from hyserve.kernels.nvrtc import template_kernel
from hyserve.kernels.pdl import enabled as pdl_enabled
from hyserve.kernels.rmsnorm.reference import rms_norm_reference


@dataclass(frozen=True)
class MmaExperts:
    """A MoE block's gate_up weights (routed experts, then the shared expert as expert E), fragment-ordered."""

    gate_up: MmaPackedBF16  # [(E + 1) 2I, H], each expert's rows in tiles of 8 gate + 8 up rows
    num_experts: int  # E (the shared expert is E)
    inter: int  # I
    down: MmaPackedBF16 | None = (
        None  # [(E + 1) H, I]: the experts' down rows in order, the shared expert last
    )

    @property
    def nbytes(self) -> int:
        return self.gate_up.nbytes + (self.down.nbytes if self.down is not None else 0)


def _tile_order(inter: int) -> torch.Tensor:
    """[2I] row permutation of one expert's gate_up: tile j holds gate rows 8j..8j+7, then up rows 8j..8j+7."""
    j = torch.arange(inter // 8)[:, None]
    r = torch.arange(8)[None, :]
    return torch.cat([8 * j + r, inter + 8 * j + r], dim=1).flatten()


@torch.no_grad()
def pack_mma_experts(
    w_gate_up: torch.Tensor,
    shared_gate_up: torch.Tensor,
    w_down: torch.Tensor | None = None,
    shared_down: torch.Tensor | None = None,
) -> MmaExperts:
    """w_gate_up [E, 2I, H], shared_gate_up [2I, H] (bf16, I % 8 == 0, H % 64 == 0) and optionally w_down [E, H,
    I], shared_down [H, I] (I % 64 == 0) -> their copy."""
    e, two_i, hidden = w_gate_up.shape
    if shared_gate_up.shape != (two_i, hidden) or two_i % 16 or w_gate_up.dtype != torch.bfloat16:
        raise ValueError(
            f"pack_mma_experts takes bf16 experts [E, 2I, H] with I % 8 == 0 and a shared expert [2I, H], got "
            f"{w_gate_up.dtype} {tuple(w_gate_up.shape)} and {tuple(shared_gate_up.shape)}"
        )
    down = None
    if w_down is not None:
        if (
            w_down.shape != (e, hidden, two_i // 2)
            or shared_down is None
            or shared_down.shape != w_down.shape[1:]
        ):
            raise ValueError(
                f"pack_mma_experts: the down weights must be [E, H, I] = {(e, hidden, two_i // 2)} with a shared "
                f"expert [H, I], got {tuple(w_down.shape)} and {None if shared_down is None else tuple(shared_down.shape)}"
            )
        down = pack_mma(torch.cat([w_down.reshape(-1, two_i // 2), shared_down]))
    order = _tile_order(two_i // 2).to(w_gate_up.device)
    stacked = torch.cat([w_gate_up[:, order], shared_gate_up[order][None]]).reshape(-1, hidden)
    return MmaExperts(gate_up=pack_mma(stacked), num_experts=e, inter=two_i // 2, down=down)


def unpack_mma_experts(packed: MmaExperts) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 (w_gate_up [E, 2I, H], shared_gate_up [2I, H]) back."""
    w = unpack_mma(packed.gate_up).reshape(packed.num_experts + 1, 2 * packed.inter, -1)
    inverse = torch.argsort(_tile_order(packed.inter)).to(w.device)
    w = w[:, inverse]
    return w[:-1], w[-1]


def unpack_mma_down(packed: MmaExperts) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 (w_down [E, H, I], shared_down [H, I]) back."""
    w = unpack_mma(packed.down).reshape(packed.num_experts + 1, -1, packed.inter)
    return w[:-1], w[-1]


def gate_up_mma_reference(
    x: torch.Tensor,
    packed: MmaExperts,
    topk_ids: torch.Tensor,
    raw_logits: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_eps: float,
    shared_expert_gate: torch.Tensor | None,
) -> torch.Tensor:
    """x [1, H] (the block's input before its pre-norm), topk_ids [1, k] int32, raw_logits [1, k] fp32 (before
    rstd) -> h [k + 1, I] in x's dtype (the contract of ``gate_up_mma``; the module says what h is)."""
    w, shared = unpack_mma_experts(packed)
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + norm_eps)  # [1]
    xn = rms_norm_reference(x, norm_weight, norm_eps).float()[0]  # [H], rounded to x's dtype
    logits = (raw_logits.float()[0] * rstd).to(x.dtype).float()
    weights = torch.softmax(logits, dim=0).to(x.dtype).float()
    mats = torch.cat([w[topk_ids[0].long()], shared[None].to(w.device)]).float()  # [k + 1, 2I, H]
    gu = mats @ xn  # [k + 1, 2I]
    inter = packed.inter
    if shared_expert_gate is not None:
        sw = torch.sigmoid(xn @ shared_expert_gate.float().reshape(-1))[None]
    else:
        sw = torch.ones(1, device=x.device)
    scale = torch.cat([weights, sw])[:, None]
    g, u = gu[:, :inter], gu[:, inter:]
    return (g / (1.0 + torch.exp(-g)) * u * scale).to(x.dtype)


SOURCE = (
    HELPERS
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

// grid (2I / 16 tiles, k + 1 pairs); pair k is the shared expert (expert E of the packed matrix)
template <int SPLIT, bool PDL>
__global__ void __launch_bounds__(32 * SPLIT) gate_up_mma(
    bf16_t* __restrict__ h, const bf16_t* __restrict__ x, const bf16_t* __restrict__ nw, float eps,
    const int* __restrict__ ids, const float* __restrict__ raw, const bf16_t* __restrict__ sgate,
    const uint4* __restrict__ low, const uint4* __restrict__ codes, const int* __restrict__ base,
    const int* __restrict__ eptr, const int* __restrict__ ecol, const float* __restrict__ edelta,
    int K, int I, int E, int k_top) {
  extern __shared__ uint4 xs[];  // [K / 8]: x_n, bf16
  __shared__ float part[SPLIT][16];
  __shared__ float red[SPLIT];
  __shared__ float red2[SPLIT];
  __shared__ float rows[16];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int p = blockIdx.y, shared = p == k_top;
  int e = E;
  if (!shared) {  // the routing's ids: written by the previous kernel
    if (PDL) pdl_wait();
    e = __ldcg(ids + p);
  }
  TileStream ts;
  ts.begin(low, codes, base, eptr, e * ((2 * I) >> 4) + blockIdx.x, K, 0, (K >> 4) / SPLIT, true, warp, lane, tid);
  if (PDL && shared) pdl_wait();
  const float rstd = load_x<SPLIT>(xs, x, nw, true, eps, K, red, tid, warp, lane);
  float wrow = 1.f;
  if (shared) {
    if (sgate) {
      const uint4* s4 = reinterpret_cast<const uint4*>(sgate);
      float dot = 0.f;
      for (int i = tid; i < (K >> 3); i += 32 * SPLIT) dot += dot8(xs[i], __ldg(s4 + i));
      wrow = 1.f / (1.f + __expf(-block_sum<SPLIT>(dot, red2, warp, lane)));
    }
  } else {  // softmax of the top-k logits scaled by rstd, each rounded through bf16 like the router's output
    float mx = __int_as_float(0xff800000), num = 0.f, den = 0.f;
    for (int q = 0; q < k_top; ++q) mx = fmaxf(mx, bf16_lo(pack_bf16x2(__ldcg(raw + q) * rstd, 0.f)));
    for (int q = 0; q < k_top; ++q) {
      const float z = __expf(bf16_lo(pack_bf16x2(__ldcg(raw + q) * rstd, 0.f)) - mx);
      den += z;
      if (q == p) num = z;
    }
    wrow = bf16_lo(pack_bf16x2(num / den, 0.f));
  }
  ts.first_escape(ecol, edelta);
  __syncthreads();
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  ts.run(c, reinterpret_cast<const unsigned int*>(xs), lane & 3);
  const float acc = ts.row_sum<SPLIT>(c, part, reinterpret_cast<const bf16_t*>(xs), ecol, edelta, warp, lane, tid);
  if (tid < 16) rows[tid] = acc;
  __syncthreads();
  if (tid < 8) {  // row tid of the tile is gate i, row tid + 8 up i, i = 8 blockIdx.x + tid
    const float gv = rows[tid], uv = rows[tid + 8];
    h[(size_t)p * I + 8 * blockIdx.x + tid] = to_bf16(gv / (1.f + __expf(-gv)) * uv * wrow);
  }
}
"""
)

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_PARAMS = (_P, _P, _P, _F, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I)


def gate_up_mma(
    x: torch.Tensor,
    packed: MmaExperts,
    topk_ids: torch.Tensor,
    raw_logits: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_eps: float,
    shared_expert_gate: torch.Tensor | None,
    split: int = 8,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """See ``gate_up_mma_reference``: x [1, H] bf16 CUDA -> h [k + 1, I] bf16."""
    k_top = topk_ids.shape[-1]
    hidden = x.shape[-1]
    require(
        x.shape == (1, hidden) and x.dtype == torch.bfloat16 and x.is_cuda and x.is_contiguous()
        and topk_ids.dtype == torch.int32 and topk_ids.numel() == k_top and topk_ids.is_contiguous()
        and raw_logits.dtype == torch.float32 and raw_logits.numel() == k_top and raw_logits.is_contiguous()
        and norm_weight.shape == (hidden,) and norm_weight.dtype == torch.bfloat16,
        "gate_up_mma takes one contiguous bf16 token, int32 top-k ids, fp32 raw logits and a bf16 norm weight",
    )  # fmt: skip
    require(
        split in SPLITS and hidden % (128 * split) == 0,
        f"gate_up_mma: SPLIT {split} does not divide {hidden}",
    )
    sg = None
    if shared_expert_gate is not None:
        sg = shared_expert_gate.reshape(-1)
        require(
            sg.numel() == hidden and sg.is_contiguous(), "gate_up_mma: the shared gate must be [H] contiguous"
        )
    inter = packed.inter
    if out is None:
        out = torch.empty((k_top + 1, inter), device=x.device, dtype=x.dtype)
    pdl = pdl_enabled(x)
    template_kernel(SOURCE, "gate_up_mma", (split, pdl), _PARAMS, x.device).launch(
        (2 * inter // 16, k_top + 1),
        32 * split,
        (out, x, norm_weight, float(norm_eps), topk_ids, raw_logits, sg, *_operands(packed.gate_up),
         hidden, inter, packed.num_experts, k_top),
        shared_mem=2 * hidden,
        pdl=pdl,
    )  # fmt: skip
    return out


def _operands(p: MmaPackedBF16) -> tuple[torch.Tensor, ...]:
    return p.low, p.codes, p.base, p.escape_ptr, p.escape_col, p.escape_delta
