"""Decode and prefill floors from a model config: bytes read and FLOPs per forward step.

Pure functions over a Hugging Face ``config.json`` dict (flat, or multimodal with a ``text_config``), for
the Qwen3.5/3.6 family: ``qwen3_5_moe`` (Gated DeltaNet + gated attention + routed/shared experts) and
dense ``qwen3_5`` (``intermediate_size``, no experts); plain full-attention Qwen3/Qwen3-MoE configs (no
``layer_types``) work too. The model is: every weight the step touches is read once from HBM, plus the
per-sequence state (GDN recurrent state read and written, KV cache read), and the step takes
``max(bytes / HBM bandwidth, FLOPs / matrix rate)``. Left out: norms, biases, the GDN conv state and conv
weights, the one-row-per-token embedding read, and the MTP head (all well under 1% of a step).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class GpuSpec:
    """A GPU's ceilings: ``hbm_bytes_per_s`` (achievable HBM read, bytes/s), ``matmul_flops`` (FLOP/s)."""

    name: str
    hbm_bytes_per_s: float
    matmul_flops: float


GPUS: dict[str, GpuSpec] = {
    # measured HBM read bandwidth (the 4.8 TB/s datasheet figure is not reachable) and dense bf16 tensor core
    "h200": GpuSpec("h200", hbm_bytes_per_s=4.0e12, matmul_flops=728e12),
}


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language-model part of a config: ``config["text_config"]`` when present, else ``config``."""
    return config.get("text_config") or config


def load_config(model_dir: str | Path) -> dict[str, Any]:
    """Read ``<model_dir>/config.json`` (the full dict; the functions here pick ``text_config`` themselves)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"no config.json in {model_dir}")
    with path.open() as f:
        return json.load(f)


@dataclass(frozen=True)
class ModelShape:
    """The dimensions the floors need, parsed from a config (see :func:`model_shape`)."""

    hidden: int
    vocab: int
    n_linear: int  # Gated DeltaNet layers
    n_full: int  # softmax-attention layers
    # attention
    heads: int
    kv_heads: int
    head_dim: int
    attn_output_gate: bool
    # Gated DeltaNet
    gdn_k_heads: int
    gdn_v_heads: int
    gdn_k_dim: int
    gdn_v_dim: int
    gdn_state_bytes: int
    # MLP: experts == 0 means dense with ``intermediate`` columns
    experts: int
    top_k: int
    intermediate: int
    shared_intermediate: int

    @property
    def gdn_layer_params(self) -> int:
        """Weights of one GDN layer: in_proj_qkv, in_proj_z, in_proj_a/b, out_proj."""
        h, kd, vd = self.hidden, self.gdn_k_heads * self.gdn_k_dim, self.gdn_v_heads * self.gdn_v_dim
        return h * (2 * kd + vd) + h * vd + 2 * h * self.gdn_v_heads + vd * h

    @property
    def attn_layer_params(self) -> int:
        """Weights of one attention layer: q_proj (doubled by the output gate), k/v_proj, o_proj."""
        h, qd = self.hidden, self.heads * self.head_dim
        q_out = 2 * qd if self.attn_output_gate else qd
        return h * q_out + 2 * h * self.kv_heads * self.head_dim + qd * h

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up, down), or of the dense MLP when ``experts == 0``."""
        return 3 * self.hidden * self.intermediate

    @property
    def mlp_fixed_params(self) -> int:
        """MLP weights read by every token regardless of routing: shared expert and router."""
        if self.experts == 0:
            return 0
        return 3 * self.hidden * self.shared_intermediate + self.hidden * self.experts

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def gdn_state_bytes_per_seq(self) -> int:
        """Recurrent state of one sequence over all GDN layers, bytes (read once and written once a step)."""
        per_layer = self.gdn_v_heads * self.gdn_k_dim * self.gdn_v_dim * self.gdn_state_bytes
        return self.n_linear * per_layer

    def kv_bytes_per_token(self, kv_bytes: int) -> int:
        """KV cache of one context token over all attention layers, bytes."""
        return self.n_full * 2 * self.kv_heads * self.head_dim * kv_bytes


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    """Parse a config dict into a :class:`ModelShape`; raises ``ValueError`` on a missing dimension."""
    c = text_config(config)
    try:
        hidden, n_layers, heads = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
        vocab = c["vocab_size"]
    except KeyError as e:
        raise ValueError(f"config has no {e.args[0]!r}") from None
    layer_types = c.get("layer_types")
    if layer_types is None:
        interval = c.get("full_attention_interval")
        if interval:
            layer_types = [
                "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)
            ]
        else:
            layer_types = ["full_attention"] * n_layers
    n_linear = sum(t == "linear_attention" for t in layer_types)
    experts = int(c.get("num_experts") or 0)
    if experts:
        intermediate = c["moe_intermediate_size"]
    elif "intermediate_size" in c:
        intermediate = c["intermediate_size"]
    else:
        raise ValueError("config has neither num_experts nor intermediate_size")
    is_qwen3_5 = str(c.get("model_type", "")).startswith("qwen3_5")
    return ModelShape(
        hidden=hidden,
        vocab=vocab,
        n_linear=n_linear,
        n_full=len(layer_types) - n_linear,
        heads=heads,
        kv_heads=c.get("num_key_value_heads", heads),
        head_dim=c.get("head_dim") or hidden // heads,
        attn_output_gate=bool(c.get("attn_output_gate", is_qwen3_5)),
        gdn_k_heads=c.get("linear_num_key_heads", 0),
        gdn_v_heads=c.get("linear_num_value_heads", 0),
        gdn_k_dim=c.get("linear_key_head_dim", 0),
        gdn_v_dim=c.get("linear_value_head_dim", 0),
        gdn_state_bytes=_DTYPE_BYTES.get(str(c.get("mamba_ssm_dtype", "float32")), 4),
        experts=experts,
        top_k=int(c.get("num_experts_per_tok") or 0),
        intermediate=intermediate,
        shared_intermediate=c.get("shared_expert_intermediate_size") or 0,
    )


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts hit by ``tokens`` tokens routed uniformly to ``top_k`` each."""
    if num_experts == 0 or tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def weight_bytes_per_step(config: Mapping[str, Any], tokens: int, weight_bytes: float = 2) -> float:
    """Bytes of weights read by one forward step over ``tokens`` tokens (each weight read once).

    ``weight_bytes`` is bytes per parameter (2 for bf16). The lm_head counts whole: a decode step computes
    logits for every token of the batch.
    """
    s = model_shape(config)
    if s.experts:
        mlp = expected_distinct_experts(s.experts, s.top_k, tokens) * s.expert_params + s.mlp_fixed_params
    else:
        mlp = s.expert_params
    layers = s.n_linear * s.gdn_layer_params + s.n_full * s.attn_layer_params + (s.n_linear + s.n_full) * mlp
    return (layers + s.lm_head_params) * weight_bytes


def state_bytes_per_step(
    config: Mapping[str, Any], batch: int, context_len: float, kv_bytes: int = 2
) -> float:
    """Bytes of per-sequence state moved by one decode step of ``batch`` sequences of ``context_len`` tokens.

    GDN recurrent state read and written (dtype from ``mamba_ssm_dtype``, fp32 by default) plus the KV cache
    read of the attention layers (``kv_bytes`` per element).
    """
    s = model_shape(config)
    per_seq = 2 * s.gdn_state_bytes_per_seq + s.kv_bytes_per_token(kv_bytes) * context_len
    return batch * per_seq


def active_params_per_token(config: Mapping[str, Any]) -> int:
    """Parameters one token multiplies through (``top_k`` routed experts, shared expert, lm_head)."""
    s = model_shape(config)
    mlp = (s.top_k * s.expert_params + s.mlp_fixed_params) if s.experts else s.expert_params
    layers = s.n_linear * s.gdn_layer_params + s.n_full * s.attn_layer_params + (s.n_linear + s.n_full) * mlp
    return layers + s.lm_head_params


def decode_step_flops(config: Mapping[str, Any], batch: int, context_len: float) -> float:
    """Matrix FLOPs of one decode step: 2 per active parameter per token plus attention scores/values."""
    s = model_shape(config)
    attn = s.n_full * 4 * s.heads * s.head_dim * context_len
    return batch * (2.0 * active_params_per_token(config) + attn)


def decode_step_time_s(
    config: Mapping[str, Any], batch: int, context_len: float, gpu: GpuSpec, weight_bytes: float = 2
) -> float:
    """Floor on one decode step of ``batch`` sequences with ``context_len`` context tokens each, seconds."""
    bytes_ = weight_bytes_per_step(config, batch, weight_bytes) + state_bytes_per_step(
        config, batch, context_len
    )
    return max(bytes_ / gpu.hbm_bytes_per_s, decode_step_flops(config, batch, context_len) / gpu.matmul_flops)


def decode_floor_tok_s(
    config: Mapping[str, Any], batch: int, context_len: float, gpu: GpuSpec, weight_bytes: float = 2
) -> float:
    """Ceiling on aggregate decode throughput of ``batch`` sequences, output tokens/s (prefill excluded)."""
    return batch / decode_step_time_s(config, batch, context_len, gpu, weight_bytes)


def prefill_flops(config: Mapping[str, Any], prompt_tokens: int) -> float:
    """Matrix FLOPs to prefill one prompt: 2 per active non-lm_head parameter per token, attention
    (causal, so half the square), and the lm_head for the last token only."""
    s = model_shape(config)
    body = active_params_per_token(config) - s.lm_head_params
    attn = s.n_full * 2 * s.heads * s.head_dim * prompt_tokens * prompt_tokens
    return 2.0 * body * prompt_tokens + attn + 2.0 * s.lm_head_params


def prefill_floor_s(
    config: Mapping[str, Any], prompt_tokens: int, gpu: GpuSpec, weight_bytes: float = 2
) -> float:
    """Floor on an idle-server prefill of one ``prompt_tokens`` prompt (the TTFT floor), seconds."""
    bytes_ = weight_bytes_per_step(config, prompt_tokens, weight_bytes) + state_bytes_per_step(config, 1, 0)
    return max(bytes_ / gpu.hbm_bytes_per_s, prefill_flops(config, prompt_tokens) / gpu.matmul_flops)


def throughput_floor_tok_s(
    config: Mapping[str, Any],
    concurrency: int,
    prompt_len: int,
    output_len: int,
    gpu: GpuSpec,
    weight_bytes: float = 2,
    include_prefill: bool = False,
) -> float:
    """Ceiling on output tokens/s with ``concurrency`` requests of ``prompt_len`` + ``output_len`` in flight.

    Decode runs at batch ``concurrency`` with the mean context ``prompt_len + output_len / 2``. With
    ``include_prefill`` each request also costs its prefill FLOPs at the matrix rate, serialized with decode
    (prefill weight reads are assumed shared with the decode steps they are batched with).
    """
    step = decode_step_time_s(config, concurrency, prompt_len + output_len / 2, gpu, weight_bytes)
    per_request = output_len * step / concurrency
    if include_prefill:
        per_request += prefill_flops(config, prompt_len) / gpu.matmul_flops
    return output_len / per_request
