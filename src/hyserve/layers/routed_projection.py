"""The MoE router's logits carried by the mixer's projections at one token (an optional feature:
``prepare_routed_projections`` at load; ``kernels/routed_projection`` has the math and the kernels).

For each MoE decoder layer it appends the router's rows to the mixer's in-projection (``W_r'`` after in_proj's or
qkv's rows) and puts them before the out-projection's (``M = W_r' W_o`` before out_proj's or o_proj's rows),
keeping the modules' weights as views of their own rows (every other path sees the weights it had), and hooks the
three modules: at one token the in-projection leaves ``W_r' h0`` here, the out-projection consumes it and leaves
the top-k (ids and raw logits), the MoE block takes it and skips its router. Anything else (more tokens, the
reference path) leaves nothing here and runs as before.
"""

from __future__ import annotations

import torch
from torch import nn

from hyserve.kernels import routed_projection as rp


class RoutedProjections:
    """One decoder layer's hooks and the hand-offs of its forward (in-projection -> out-projection -> MoE)."""

    def __init__(self, in_proj: nn.Module, out_proj: nn.Module, moe: nn.Module, norm: nn.Module) -> None:
        n_in, hidden = in_proj.weight.shape
        n_out, k_out = out_proj.weight.shape
        num_experts = moe.gate.weight.shape[0]
        found = rp.plans(n_in, hidden, n_out, k_out, num_experts)
        if n_out != hidden or found is None:
            raise ValueError(
                f"routed projections need GEMV plans for [{n_in}, {hidden}] and [{n_out}, {k_out}] whose row "
                f"blocks divide {num_experts} experts, and an out-projection onto the hidden size {hidden}"
            )
        self._shapes = (n_in, hidden, n_out, k_out, num_experts)
        wr, m = rp.build_router_rows(moe.gate.weight, norm.weight, out_proj.weight)
        self.w_in = torch.cat([in_proj.weight.data, wr])  # [n_in + E, H]
        self.w_out = torch.cat(
            [m, out_proj.weight.data]
        )  # [E + H, Hv]: M's programs first (triton_kernel.py)
        in_proj.weight.data = self.w_in[:n_in]
        out_proj.weight.data = self.w_out[num_experts:]
        self.n_in, self.num_experts, self.top_k = n_in, num_experts, moe.top_k
        # w_in's and w_out's fragment-ordered 12-bit copies for the tensor-core kernels, if made
        # (layers/mma_projections.py)
        self.w_in_mma = self.w_out_mma = None
        self._partial: torch.Tensor | None = None  # [1, E]: W_r' h0, from the in-projection
        self._routing: tuple[torch.Tensor, torch.Tensor] | None = None  # for the MoE block: ids, raw logits
        in_proj.fusion, out_proj.fusion, moe.routed = self.project_in, self.project_out, self

    def _plans(self) -> tuple[dict | None, dict | None]:
        """The GEMV plans now (looked up per call, which only capture and eager steps make, so a tuner's tables
        take effect when it re-captures); (None, None), the reference path, if they no longer fit."""
        return rp.plans(*self._shapes) or (None, None)

    @property
    def nbytes(self) -> int:
        """The router rows added to the two weights."""
        return self.num_experts * (
            self.w_in.stride(0) * self.w_in.element_size() + self.w_out.stride(0) * self.w_out.element_size()
        )

    def project_in(self, x: torch.Tensor, norm: nn.Module | None, residual: torch.Tensor | None):
        """The in-projection at one token: its output, ``W_r' h0`` kept; None (not taken) otherwise."""
        if norm is None or residual is not None or not rp.fast(x, self.w_in):
            return None
        y = rp.project_in(x, self.w_in, self.n_in, norm.weight, norm.eps, self._plans()[0], self.w_in_mma)
        self._partial = y[:, self.n_in :]  # [1, E]: the router's rows
        return y[:, : self.n_in]

    def project_out(self, a: torch.Tensor, norm: nn.Module | None, residual: torch.Tensor | None):
        """The out-projection after a taken in-projection: h1 in the residual, the top-k kept."""
        partial, self._partial = self._partial, None
        if partial is None or norm is not None or residual is None:
            return None
        self._routing = rp.project_out_route(
            a, self.w_out, residual, partial, self.top_k, self._plans()[1], self.w_out_mma
        )
        return residual

    def take_routing(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The top-k (ids, raw logits) of this forward's out-projection, once (None if it was not taken)."""
        routing, self._routing = self._routing, None
        return routing


def mixer_projections(layer: nn.Module) -> tuple[nn.Module, nn.Module]:
    """A decoder layer's mixer's (in-projection, out-projection): (in_proj, out_proj) of a DeltaNet, (qkv_proj,
    o_proj) of an attention layer."""
    mixer = getattr(layer, "linear_attn", None) or layer.self_attn
    if hasattr(mixer, "in_proj"):
        return mixer.in_proj, mixer.out_proj
    return mixer.qkv_proj, mixer.o_proj


def prepare_routed_projections(model: nn.Module) -> int:
    """Hook every MoE decoder layer of ``model`` whose projections have the GEMV plans; returns the bytes added."""
    total = 0
    for layer in model.model.layers:
        moe = getattr(layer, "mlp", None)
        if not hasattr(moe, "gate"):
            continue
        in_proj, out_proj = mixer_projections(layer)
        try:
            total += RoutedProjections(in_proj, out_proj, moe, layer.post_attention_layernorm).nbytes
        except ValueError:
            continue
    return total
