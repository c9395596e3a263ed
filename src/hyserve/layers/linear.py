"""A bias-free linear layer ``y = x W^T`` (with the pre-norm and residual add it may fuse); the place where
weight formats other than BF16 will plug in."""

from __future__ import annotations

import torch
from torch import nn

from hyserve import kernels as ops
from hyserve.layers.sources import WeightSource, set_sources


class Linear(nn.Module):
    """weight: [out_features, in_features]. ``parts`` names sibling checkpoint tensors (e.g. ``gate_proj``) that
    are stacked along the output rows into this one weight, in order (e.g. ``gate_proj``, ``up_proj``)."""

    def __init__(self, in_features: int, out_features: int, parts: tuple[tuple[str, int], ...] = ()) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        # an optional fusion that takes this projection over where it applies (returns None elsewhere):
        # layers/routed_projection.py
        self.fusion = None
        if parts:
            layout, row = [], 0
            for name, rows in parts:
                layout.append(WeightSource(f"../{name}.weight", (slice(row, row + rows),)))
                row += rows
            if row != out_features:
                raise ValueError(f"stacked parts cover {row} rows, the layer has {out_features}")
            set_sources(self, "weight", [layout])

    def forward(
        self, x: torch.Tensor, norm: nn.Module | None = None, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[residual +] norm(x) W^T``: a pre-norm (an ``RMSNorm``: ``weight``, ``eps``) and a residual add
        (in place, the residual returned) run inside the projection where the kernels can fuse them."""
        if self.fusion is not None and (y := self.fusion(x, norm, residual)) is not None:
            return y
        if norm is None:
            return ops.linear(x, self.weight, residual=residual)
        return ops.linear(x, self.weight, norm_weight=norm.weight, norm_eps=norm.eps, residual=residual)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}"
