"""The model configuration: one frozen dataclass derived from a checkpoint's ``config.json``.

Accepts the multimodal top-level config (``Qwen3_5MoeForConditionalGeneration``, text fields under
``text_config``) and the flat text config (``Qwen3_5MoeForCausalLM``), for the MoE family
(``qwen3_5_moe``: 35B-A3B, 122B-A10B, 397B-A17B) and the dense family (``qwen3_5``: 0.8B-27B).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = {
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_text": "qwen3_5_moe",
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
}
LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"


@dataclass(frozen=True)
class ModelConfig:
    """Text-model hyper-parameters. Field names follow ``config.json``."""

    model_type: str  # "qwen3_5_moe" or "qwen3_5"
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]  # one of LINEAR_ATTENTION / FULL_ATTENTION per layer
    rms_norm_eps: float
    # gated full attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    max_position_embeddings: int
    # Gated DeltaNet
    linear_conv_kernel_dim: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    # feed-forward: MoE (qwen3_5_moe) or dense (qwen3_5)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    intermediate_size: int = 0
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    dtype: str = "bfloat16"  # the checkpoint's storage dtype
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    mtp_num_hidden_layers: int = 0
    architecture: str = ""  # the checkpoint's architectures[0], informational

    @property
    def is_moe(self) -> bool:
        return self.model_type == "qwen3_5_moe"

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the depthwise conv: [q | k | v]."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION)

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ValueError(f"{model_dir!s} has no config.json; expected a Hugging Face model folder")
        with open(path) as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        top_type = raw.get("model_type")
        if top_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {top_type!r} (architectures {raw.get('architectures')}); hyserve "
                f"supports qwen3_5_moe (Qwen3.5/3.6 MoE) and qwen3_5 (Qwen3.5/3.6 dense), as the multimodal "
                f"config with text_config or the flat text config"
            )
        text = dict(raw.get("text_config") or raw)
        model_type = SUPPORTED_MODEL_TYPES[top_type]
        text_type = text.get("model_type", top_type)
        if SUPPORTED_MODEL_TYPES.get(text_type) != model_type:
            raise ValueError(f"text_config.model_type {text_type!r} does not match model_type {top_type!r}")

        def need(key: str) -> Any:
            if key not in text:
                raise ValueError(f"config.json lacks {key!r}, required for {model_type}")
            return text[key]

        n_layers = int(need("num_hidden_layers"))
        layer_types = text.get("layer_types")
        if layer_types is None:
            interval = int(text.get("full_attention_interval", 4))
            layer_types = [
                LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION for i in range(n_layers)
            ]
        layer_types = tuple(layer_types)
        if len(layer_types) != n_layers or any(
            t not in (LINEAR_ATTENTION, FULL_ATTENTION) for t in layer_types
        ):
            raise ValueError(
                f"layer_types must list {n_layers} entries, each {LINEAR_ATTENTION!r} or {FULL_ATTENTION!r}; "
                f"got {list(layer_types)}"
            )
        rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "mrope"):
            raise ValueError(f"rope_type {rope_type!r} is not supported; supported: 'default'")
        rope_theta = float(rope.get("rope_theta", text.get("rope_theta", 10000.0)))
        partial = float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)))

        eos = text.get("eos_token_id", raw.get("eos_token_id"))
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        if text.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {text.get('hidden_act')!r} is not supported; supported: 'silu'")

        common = dict(
            model_type=model_type,
            vocab_size=int(need("vocab_size")),
            hidden_size=int(need("hidden_size")),
            num_hidden_layers=n_layers,
            layer_types=layer_types,
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            num_attention_heads=int(need("num_attention_heads")),
            num_key_value_heads=int(need("num_key_value_heads")),
            head_dim=int(
                text.get("head_dim") or int(need("hidden_size")) // int(need("num_attention_heads"))
            ),
            rope_theta=rope_theta,
            partial_rotary_factor=partial,
            max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
            linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
            linear_key_head_dim=int(text.get("linear_key_head_dim", 128)),
            linear_value_head_dim=int(text.get("linear_value_head_dim", 128)),
            linear_num_key_heads=int(text.get("linear_num_key_heads", 16)),
            linear_num_value_heads=int(text.get("linear_num_value_heads", 32)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            dtype=str(text.get("dtype") or text.get("torch_dtype") or raw.get("dtype") or "bfloat16"),
            eos_token_ids=eos_ids,
            bos_token_id=text.get("bos_token_id"),
            pad_token_id=text.get("pad_token_id"),
            mtp_num_hidden_layers=int(text.get("mtp_num_hidden_layers", 0)),
            architecture=(raw.get("architectures") or [""])[0],
        )
        if model_type == "qwen3_5_moe":
            common.update(
                num_experts=int(need("num_experts")),
                num_experts_per_tok=int(need("num_experts_per_tok")),
                moe_intermediate_size=int(need("moe_intermediate_size")),
                shared_expert_intermediate_size=int(text.get("shared_expert_intermediate_size", 0)),
            )
        else:
            common.update(intermediate_size=int(need("intermediate_size")))
        cfg = cls(**common)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(
                f"rotary dim {self.rotary_dim} must be even and at most head_dim {self.head_dim}"
            )
        if self.is_moe and not (0 < self.num_experts_per_tok <= self.num_experts):
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be in 1..num_experts ({self.num_experts})"
            )
