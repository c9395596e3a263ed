"""Tiny random checkpoints written by transformers' own classes, for comparing hyserve against it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

MOE_TEXT = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=24,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    num_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=1024,
    full_attention_interval=4,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
)
DENSE_TEXT = {
    k: v
    for k, v in MOE_TEXT.items()
    if k
    not in ("moe_intermediate_size", "shared_expert_intermediate_size", "num_experts", "num_experts_per_tok")
} | {"intermediate_size": 96}
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """transformers initialises norms to 0/1 and routers to N(0, 0.02): make every tensor matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.0, 2.5, generator=gen))
            elif p.dim() == 1 or name.endswith(".norm.weight"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.6 / p.shape[-1] ** 0.5)


def make_checkpoint(
    path: Path,
    kind: str = "moe",
    multimodal: bool = False,
    expert_layout: str = "saved",
    seed: int = 0,
    **overrides,
) -> Path:
    """Save a tiny random model with ``save_pretrained``. kind: moe | dense. expert_layout: saved (whatever
    transformers writes), fused ([E, 2I, H] / [E, H, I]) or per_expert. Returns ``path``."""
    import transformers as tf

    torch.manual_seed(seed)
    text = dict(MOE_TEXT if kind == "moe" else DENSE_TEXT) | overrides
    if kind == "moe":
        config = (
            tf.Qwen3_5MoeConfig(text_config=text, vision_config=VISION)
            if multimodal
            else tf.Qwen3_5MoeTextConfig(**text)
        )
        cls = tf.Qwen3_5MoeForConditionalGeneration if multimodal else tf.Qwen3_5MoeForCausalLM
    else:
        config = (
            tf.Qwen3_5Config(text_config=text, vision_config=VISION)
            if multimodal
            else tf.Qwen3_5TextConfig(**text)
        )
        cls = tf.Qwen3_5ForConditionalGeneration if multimodal else tf.Qwen3_5ForCausalLM
    model = cls(config).eval()
    _perturb(model, seed)
    model.save_pretrained(path)
    if kind == "moe" and expert_layout != "saved":
        _rewrite_experts(path, fused=expert_layout == "fused", num_experts=text["num_experts"])
    return path


def _rewrite_experts(path: Path, fused: bool, num_experts: int) -> None:
    file = path / "model.safetensors"
    tensors = load_file(file)
    out: dict[str, torch.Tensor] = {}
    prefixes = sorted({k.split("mlp.experts.")[0] for k in tensors if "mlp.experts." in k})
    for k, v in tensors.items():
        if "mlp.experts." not in k:
            out[k] = v
    for pre in prefixes:
        e = f"{pre}mlp.experts."
        if f"{e}gate_up_proj" in tensors:
            gate_up, down = tensors[f"{e}gate_up_proj"], tensors[f"{e}down_proj"]
        else:
            gate_up = torch.stack(
                [
                    torch.cat([tensors[f"{e}{i}.gate_proj.weight"], tensors[f"{e}{i}.up_proj.weight"]])
                    for i in range(num_experts)
                ]
            )
            down = torch.stack([tensors[f"{e}{i}.down_proj.weight"] for i in range(num_experts)])
        if fused:
            out[f"{e}gate_up_proj"], out[f"{e}down_proj"] = gate_up.contiguous(), down.contiguous()
        else:
            inter = gate_up.shape[1] // 2
            for i in range(num_experts):
                out[f"{e}{i}.gate_proj.weight"] = gate_up[i, :inter].contiguous()
                out[f"{e}{i}.up_proj.weight"] = gate_up[i, inter:].contiguous()
                out[f"{e}{i}.down_proj.weight"] = down[i].contiguous()
    save_file(out, file, metadata={"format": "pt"})


def load_reference(path: Path):
    """The transformers model of a checkpoint folder, fp32, eval mode."""
    import transformers as tf

    with open(path / "config.json") as f:
        arch = json.load(f)["architectures"][0]
    return getattr(tf, arch).from_pretrained(path, dtype=torch.float32).eval()
