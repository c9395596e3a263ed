"""Build a model and fill its weights: from sharded safetensors in the Hugging Face layout, or dummy.

Checkpoint keys carry ``model.language_model.`` (multimodal checkpoints) or ``model.`` (text-only);
``lm_head.weight`` sits at the top. Vision (``model.visual.*``) and MTP (``mtp.*``) tensors are skipped.
Shards are read one at a time through safetensors' memory map, so host memory stays near one tensor.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from hyserve.config import ModelConfig
from hyserve.layers import WeightSource, get_sources, resolve_key
from hyserve.model.qwen3_5 import Qwen3_5ForCausalLM

log = logging.getLogger(__name__)

LOAD_FORMATS = ("auto", "safetensors", "dummy")
_SKIPPED_PREFIXES = ("model.visual.", "mtp.", "model.mtp.", "model.language_model.mtp.")


def build_model(
    config: ModelConfig,
    model_dir: str | Path | None,
    device: torch.device | str,
    dtype: torch.dtype,
    load_format: str = "auto",
    seed: int = 0,
    progress: bool = True,
) -> Qwen3_5ForCausalLM:
    """Create the model with uninitialised storage on ``device`` and fill it."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format {load_format!r} is not one of {LOAD_FORMATS}")
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.eval()
    if load_format == "dummy":
        init_dummy_weights(model, seed)
    else:
        if model_dir is None:
            raise ValueError("a model directory is required unless load_format='dummy'")
        load_safetensors(model, Path(model_dir), progress=progress)
    return model


def _checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} holds no *.safetensors files (or use --load-format dummy)")
    return files


def _plan(model: nn.Module, available: set[str]) -> dict[str, list[tuple[nn.Parameter, str, WeightSource]]]:
    """checkpoint key -> [(parameter, its name, where it goes)], choosing one layout per parameter."""
    text_prefix = (
        "model.language_model." if any(k.startswith("model.language_model.") for k in available) else ""
    )
    plan: dict[str, list[tuple[nn.Parameter, str, WeightSource]]] = defaultdict(list)
    missing = []
    for name, param in model.named_parameters():
        owner, _, own = name.rpartition(".")
        layouts = get_sources(model.get_submodule(owner), own)
        chosen = None
        for layout in layouts:
            keys = [resolve_key(owner, s.key) for s in layout]
            if text_prefix:
                keys = [text_prefix + k[len("model.") :] if k.startswith("model.") else k for k in keys]
            if all(k in available for k in keys):
                chosen = list(zip(keys, layout))
                break
        if chosen is None:
            first = [resolve_key(owner, s.key) for s in layouts[0]]
            missing.append(f"{name} (checkpoint key {first[0]}{' ...' if len(first) > 1 else ''})")
            continue
        for key, source in chosen:
            plan[key].append((param, name, source))
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. " + "; ".join(missing[:5]))
    return plan


@torch.no_grad()
def load_safetensors(model: nn.Module, model_dir: Path, progress: bool = True) -> None:
    files = _checkpoint_files(model_dir)
    keys_by_file = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            keys_by_file[path] = list(f.keys())
    available = {k for keys in keys_by_file.values() for k in keys}
    plan = _plan(model, available)
    skipped = unexpected = 0
    bar = tqdm(total=len(plan), desc="Loading weights", unit="tensor", disable=not progress)
    for path in files:
        with safe_open(path, framework="pt") as f:
            for key in keys_by_file[path]:
                targets = plan.get(key)
                if targets is None:
                    if key.startswith(_SKIPPED_PREFIXES):
                        skipped += 1
                    else:
                        unexpected += 1
                    continue
                tensor = f.get_tensor(key)
                for param, name, source in targets:
                    dest = param[source.index] if source.index else param
                    expected = source.shape or tuple(dest.shape)
                    if tuple(tensor.shape) != tuple(expected):
                        raise ValueError(
                            f"tensor {key} has shape {list(tensor.shape)}, but {name} expects {list(expected)}"
                        )
                    dest.copy_(tensor.view(dest.shape))
                bar.update(1)
    bar.close()
    if unexpected:
        log.warning("ignored %d checkpoint tensors that this model does not use", unexpected)
    log.info(
        "loaded %d tensors from %d shards (%d vision/MTP tensors skipped)", len(plan), len(files), skipped
    )


_OUTPUT_PROJECTIONS = ("out_proj.weight", "o_proj.weight", "down_proj.weight", "down_proj")


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Seeded random weights written in place on the model's device (no host copy).

    Scaled so activations stay O(1) through every layer: matrices ~ N(0, 1/fan_in) (output projections
    halved), zero-centred norm weights near 0, the DeltaNet output norm near 1, decays in the trained
    range, and a router whose logits have unit spread so tokens spread over the experts.
    """
    for i, (name, param) in enumerate(model.named_parameters()):
        gen = torch.Generator(device=param.device).manual_seed(seed * 1_000_003 + i)
        if name.endswith("A_log"):
            param.uniform_(1.0, 16.0, generator=gen).log_()
        elif name.endswith("dt_bias"):
            param.uniform_(0.5, 1.5, generator=gen)
        elif name.endswith("linear_attn.norm.weight"):
            param.normal_(1.0, 0.05, generator=gen)
        elif param.dim() == 1:
            param.normal_(0.0, 0.05, generator=gen)
        elif name.endswith("embed_tokens.weight"):
            param.normal_(0.0, 1.0, generator=gen)
        elif name.endswith("conv1d.weight"):
            param.normal_(0.0, 1.0 / math.sqrt(param.shape[-1]), generator=gen)
        else:
            fan_in = param.shape[-1]
            scale = 0.5 if name.endswith(_OUTPUT_PROJECTIONS) else 1.0
            param.normal_(0.0, scale / math.sqrt(fan_in), generator=gen)


def checkpoint_views(model: nn.Module) -> dict[str, torch.Tensor]:
    """The inverse of loading: text-only checkpoint key (``model.*``, ``lm_head.weight``) -> a view of the
    engine's tensor holding it, in the checkpoint's shape (each parameter's first layout)."""
    views: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        owner, _, own = name.rpartition(".")
        for source in get_sources(model.get_submodule(owner), own)[0]:
            tensor = param[source.index] if source.index else param
            views[resolve_key(owner, source.key)] = tensor.view(source.shape) if source.shape else tensor
    return views
