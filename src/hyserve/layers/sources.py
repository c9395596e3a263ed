"""Where a parameter's values come from in a Hugging Face checkpoint.

By default a parameter ``a.b.weight`` is the checkpoint tensor of the same name, same shape. A parameter
may instead list alternative layouts (e.g. experts fused into one tensor, or one tensor per expert); the
loader takes the first layout whose keys are all present. Keys are relative to the owning module.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class WeightSource:
    key: str  # checkpoint key relative to the module owning the parameter; "../" climbs one module
    index: tuple = ()  # where in the parameter it goes (param[index] = tensor)
    shape: tuple[int, ...] | None = None  # the checkpoint tensor's shape when it differs from param[index]


def set_sources(module: nn.Module, param_name: str, layouts: list[list[WeightSource]]) -> None:
    """Declare where ``module.<param_name>`` comes from (kept on the module: parameters get replaced
    when the model moves between devices)."""
    if not hasattr(module, "_weight_layouts"):
        module._weight_layouts = {}
    module._weight_layouts[param_name] = layouts


def get_sources(module: nn.Module, param_name: str) -> list[list[WeightSource]]:
    """The alternative layouts of ``module.<param_name>``, the same-named tensor by default."""
    return getattr(module, "_weight_layouts", {}).get(param_name) or [[WeightSource(param_name)]]


def resolve_key(module_prefix: str, key: str) -> str:
    """The full checkpoint key of ``key`` given relative to the module at ``module_prefix``."""
    parts = module_prefix.split(".") if module_prefix else []
    while key.startswith("../"):
        parts, key = parts[:-1], key[3:]
    return ".".join([*parts, key])
