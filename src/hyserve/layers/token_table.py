"""``--token-table``: the first decoder layer's in-projection looked up by token id (an optional feature).

The first layer's mixer projects ``norm(embed(id))``, a function of the token id alone. So its output for the
whole vocabulary is computed once at load into a table [V, N] (N the in-projection's rows, and the router's rows
after them where the routed projections hook the layer), and a step gathers its tokens' rows (~25 KB a token for
Qwen3.6-35B-A3B's 12352 + 256 columns) instead of streaming the projection's weight (51.6 MB: ~15 us of each
decode step on the H200) or multiplying by it (~53 GFLOP in a 1024-token prefill). It costs V x N values of
memory: 6.3 GB in bf16 for Qwen3.6-35B-A3B (248320 x 12608).

The rows are the reference's (``linear_reference``: the norm rounded to the model's dtype, one product with fp32
accumulation on CUDA, rounded once), so they differ from the GEMV's or cuBLAS's only by the fp32 sums' order.
"""

from __future__ import annotations

import torch
from torch import nn

from hyserve.kernels.linear.reference import linear_reference
from hyserve.kernels.routed_projection.reference import project_in_reference
from hyserve.layers.linear import Linear
from hyserve.layers.routed_projection import RoutedProjections, mixer_projections


class TokenTable:
    """The first layer's in-projection of every token id, hooked into that projection (its ``fusion``)."""

    def __init__(
        self,
        embed: nn.Embedding,
        proj: Linear,
        norm: nn.Module,
        routed: RoutedProjections | None = None,
        chunk_rows: int = 8192,
    ) -> None:
        """embed: the model's token embedding; proj, norm: the first layer's in-projection and its pre-norm;
        routed: that layer's routed projections, if they hook it (their router rows then join the table)."""
        self.norm, self.routed = norm, routed
        self.n = proj.out_features
        weight = routed.w_in if routed is not None else proj.weight  # [n (+ E), H]
        self.table = self._build(embed.weight, weight, chunk_rows)  # [V, n (+ E)], the model's dtype
        self.own = self.table[:, : self.n]  # [V, n]: the in-projection's columns alone
        self._next = proj.fusion  # the routed projections' hook, for an input that is not the embedding
        # the embedding's last call: its ids [T] and output [T, H], until the projection takes them
        self._ids: torch.Tensor | None = None
        self._embedded: torch.Tensor | None = None
        embed.register_forward_hook(self._remember)
        proj.fusion = self.project

    @torch.no_grad()
    def _build(self, embedding: torch.Tensor, weight: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        """embedding [V, H], weight [n (+ E), H] -> [V, n (+ E)], chunk_rows tokens at a time."""
        norm_weight, eps = self.norm.weight, self.norm.eps
        shape = (embedding.shape[0], weight.shape[0])
        table = torch.empty(shape, dtype=embedding.dtype, device=embedding.device)
        for start in range(0, embedding.shape[0], chunk_rows):
            e = embedding[start : start + chunk_rows]
            if self.routed is not None:
                rows = project_in_reference(e, weight, self.n, norm_weight, eps)
            else:
                rows = linear_reference(e, weight, norm_weight=norm_weight, norm_eps=eps)
            table[start : start + chunk_rows] = rows
        return table

    @property
    def nbytes(self) -> int:
        return self.table.numel() * self.table.element_size()

    def _remember(self, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        self._ids, self._embedded = args[0], output

    def project(self, x: torch.Tensor, norm: nn.Module | None, residual: torch.Tensor | None):
        """The in-projection of x [T, H] as the table's rows when x is this forward's embedding (the first
        layer's input), with the router's part kept for the routed out-projection at one token; otherwise the
        hook it replaced (or None: the plain projection)."""
        ids, embedded = self._ids, self._embedded
        self._ids = self._embedded = None  # taken once: the next forward embeds again
        if x is not embedded or norm is not self.norm or residual is not None:
            return self._next(x, norm, residual) if self._next is not None else None
        if self.routed is not None and self.routed.takes_in(x, norm, residual):
            return self.routed.keep_partial(self.table.index_select(0, ids))
        return self.own.index_select(0, ids)


def prepare_token_table(model: nn.Module) -> int:
    """Hook the table into ``model``'s first layer (after ``prepare_routed_projections``, whose router rows it
    takes in); returns the bytes it takes."""
    layer = model.model.layers[0]
    in_proj, _ = mixer_projections(layer)
    if isinstance(getattr(in_proj.fusion, "__self__", None), TokenTable):
        raise ValueError("the first layer already has its token table")
    routed = getattr(layer.mlp, "routed", None)
    return TokenTable(model.model.embed_tokens, in_proj, layer.input_layernorm, routed).nbytes
