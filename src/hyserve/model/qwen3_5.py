"""Qwen3.5 / Qwen3.6 text models: ``qwen3_5_moe`` (35B-A3B, ...) and the dense ``qwen3_5``.

Each decoder layer is ``h = x + Mixer(norm(x)); y = h + FFN(norm(h))`` where the mixer is a Gated
DeltaNet (``linear_attention``) or gated full attention (``full_attention``) and the FFN a sparse MoE
with a shared expert, or a dense SwiGLU MLP. Module and parameter names follow the checkpoint keys.
All norms are zero-centred RMSNorm ``(1 + w)`` except the DeltaNet output norm (``w``).

The residual stream x is one tensor updated in place: each block gets the layer's pre-norm, which its
first projection applies (``Linear(x, norm=...)``), and adds its output to x in its last projection
(``residual=x``), so the kernels can fuse both into the projections (at batch 1, 80 fewer launches a step).
"""

from __future__ import annotations

import torch
from torch import nn

from hyserve import kernels as ops
from hyserve.config import FULL_ATTENTION, ModelConfig
from hyserve.layers import Linear, LMHead, WeightSource, set_sources
from hyserve.model.batch import ForwardBatch, ModelCache


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class RMSNorm(nn.Module):
    """Zero-centred: ``x * rsqrt(mean(x^2) + eps) * (1 + weight)``, in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _param(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """Per-head output norm of the DeltaNet: ``weight * rmsnorm(o) * silu(z)`` (plain weight)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _param(dim)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return ops.gated_rms_norm(x, gate, self.weight, self.eps)


class DepthwiseConv1d(nn.Module):
    """Causal depthwise conv over the [q | k | v] channels; checkpoint weight [D, 1, W] kept as [D, W]."""

    def __init__(self, channels: int, width: int) -> None:
        super().__init__()
        self.weight = _param(channels, width)
        set_sources(self, "weight", [[WeightSource("weight", shape=(channels, 1, width))]])


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig, linear_index: int) -> None:
        super().__init__()
        self.linear_index = linear_index  # index into the DeltaNet state pools
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        self.key_dim = config.linear_key_dim
        self.value_dim = config.linear_value_dim
        hidden = config.hidden_size
        # in_proj_qkv | in_proj_z | in_proj_b | in_proj_a, stacked at load into one matrix: one GEMM per token
        self.proj_sizes = [config.linear_conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads]
        parts = tuple(zip(("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"), self.proj_sizes))
        self.in_proj = Linear(hidden, sum(self.proj_sizes), parts=parts)
        self.conv1d = DepthwiseConv1d(config.linear_conv_dim, config.linear_conv_kernel_dim)
        self.dt_bias = _param(self.num_v_heads)
        self.A_log = _param(self.num_v_heads)
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, hidden)

    def forward(
        self,
        x: torch.Tensor,
        norm: RMSNorm,
        batch: ForwardBatch,
        cache: ModelCache,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [T, hidden], the residual stream: ``x += out_proj(DeltaNet(norm(x)))`` in place. With ``rows`` [L]
        the state still takes every token, but only those rows go through the output norm and out_proj and come
        out, ``x[rows] + ...`` [L, hidden]."""
        t = x.shape[0]
        # mixed_qkv [T, 2*key_dim + value_dim], z [T, value_dim], b and a [T, HV]
        mixed_qkv, z, b, a = self.in_proj(x, norm).split(self.proj_sizes, dim=-1)
        z = z.view(t, self.num_v_heads, self.head_v_dim)
        conv_state = cache.conv_state[self.linear_index]
        ssm_state = cache.ssm_state[self.linear_index]
        if batch.is_decode:  # conv + gating + recurrence + norm in one fused step
            o = ops.gdn_decode_step(
                mixed_qkv,
                z,
                a,
                b,
                self.conv1d.weight,
                self.A_log,
                self.dt_bias,
                self.norm.weight,
                self.norm.eps,
                conv_state,
                ssm_state,
                batch.state_indices,
            )
            return self.out_proj(o.reshape(t, self.value_dim), residual=x)
        # the conv, and beside it the gates g = -exp(A_log) softplus(a + dt_bias) [T, HV] fp32 (log-decay <= 0)
        # and beta = sigmoid(b) (write strength)
        mixed_qkv, g, beta = ops.causal_conv1d_prefill_gated(
            mixed_qkv,
            self.conv1d.weight,
            conv_state,
            batch.cu_seqlens_q,
            batch.state_indices,
            batch.has_initial_state,
            a,
            b,
            self.A_log,
            self.dt_bias,
        )
        q, k, v = mixed_qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.view(t, self.num_k_heads, self.head_k_dim)
        k = k.view(t, self.num_k_heads, self.head_k_dim)
        v = v.view(t, self.num_v_heads, self.head_v_dim)
        o = ops.gated_delta_rule_prefill(
            q, k, v, g, beta, ssm_state, batch.cu_seqlens_q, batch.state_indices, batch.has_initial_state
        )
        if rows is not None:
            o, z, x = o[rows], z[rows], x[rows]
            if x.shape[0] == 0:
                return x
        o = self.norm(o, z)  # [T or L, HV, V]
        return self.out_proj(o.reshape(x.shape[0], self.value_dim), residual=x)


class Attention(nn.Module):
    """Gated attention: q_proj yields per head [query | gate]; q/k norm; partial RoPE; sigmoid output gate."""

    def __init__(self, config: ModelConfig, attention_index: int) -> None:
        super().__init__()
        self.attention_index = attention_index  # index into the KV cache list
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.rotary_dim = config.rotary_dim
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        hidden = config.hidden_size
        # q_proj (per head [query | gate]) | k_proj | v_proj, stacked at load into one matrix
        q_size, kv_size = self.num_heads * self.head_dim * 2, self.num_kv_heads * self.head_dim
        self.proj_sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = Linear(
            hidden, sum(self.proj_sizes), parts=(("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size))
        )
        self.o_proj = Linear(self.num_heads * self.head_dim, hidden)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        norm: RMSNorm,
        batch: ForwardBatch,
        cache: ModelCache,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [T, hidden], the residual stream: ``x += o_proj(attention(norm(x)))`` in place; rope is
        ``TextModel.rope``'s (cos table, sin table, positions). With ``rows`` [L] every row's K/V is still
        stored, but only those rows' queries attend (over the cache, like decode queries) and come out,
        ``x[rows] + ...`` [L, hidden]."""
        t = x.shape[0]
        q_gate, k, v = self.qkv_proj(x, norm).split(self.proj_sizes, dim=-1)
        q, gate = q_gate.view(t, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = cache.kv[self.attention_index]
        # q/k norm (zero-centred, 1 + w) and partial RoPE at the positions
        norm_rope = (self.q_norm.weight, self.k_norm.weight, self.eps, *rope, self.rotary_dim)
        # a prompt without a cached prefix: over its own new rows alone
        if batch.causal_rows and rows is None:
            q, k = ops.qk_norm_rope(q, k, *norm_rope)
            ops.store_kv(k, v, k_cache, v_cache, batch.slot_mapping)
            o = ops.causal_attention(q, k, v, self.scale, gate=gate)
            return self.o_proj(o.reshape(t, -1), residual=x)
        kv_store = (k_cache, v_cache, batch.slot_mapping)
        if batch.is_decode and rows is None:  # one new token a sequence: q/k norm, RoPE, KV store, attention
            o = ops.decode_attention(
                q, k, v, *norm_rope, *kv_store, batch.cu_seqlens_q, batch.seq_lens, batch.block_tables,
                self.scale, gate=gate,
            )  # fmt: skip
            return self.o_proj(o.reshape(t, -1), residual=x)
        # one kernel: the normed, roped q out; the normed, roped k and the raw v into the cache at the slots
        q = ops.qk_norm_rope_store(q, k, v, *norm_rope, *kv_store)
        if rows is None:
            o = ops.paged_attention(
                q,
                k_cache,
                v_cache,
                batch.cu_seqlens_q,
                batch.seq_lens,
                batch.block_tables,
                self.scale,
                gate=gate,
            )
            return self.o_proj(o.reshape(t, -1), residual=x)
        x = x[rows]
        if x.shape[0] == 0:
            return x
        o = ops.paged_attention(
            q[rows], k_cache, v_cache, *batch.rows_as_queries(rows), self.scale, gate=gate[rows]
        )
        return self.o_proj(o.reshape(x.shape[0], -1), residual=x)


class MLP(nn.Module):
    """SwiGLU ``down(silu(gate(x)) * up(x))``; gate_proj and up_proj are stacked into one matrix at load."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = Linear(
            hidden, 2 * intermediate, parts=(("gate_proj", intermediate), ("up_proj", intermediate))
        )
        self.down_proj = Linear(intermediate, hidden)

    def forward(
        self, x: torch.Tensor, norm: RMSNorm | None = None, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[residual +] down(silu(gate(norm(x))) * up(norm(x)))``, the residual updated in place."""
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x, norm)), residual=residual)


class Router(nn.Module):
    def __init__(self, hidden: int, num_experts: int) -> None:
        super().__init__()
        self.weight = _param(num_experts, hidden)


class Experts(nn.Module):
    """Stacked expert weights: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I].

    Checkpoints store them fused like this, or one tensor per expert (``{e}.gate_proj.weight`` ...)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = _param(num_experts, 2 * intermediate, hidden)
        self.down_proj = _param(num_experts, hidden, intermediate)
        i = intermediate
        per_expert_gate_up = []
        for e in range(num_experts):
            per_expert_gate_up.append(WeightSource(f"{e}.gate_proj.weight", (e, slice(0, i))))
            per_expert_gate_up.append(WeightSource(f"{e}.up_proj.weight", (e, slice(i, 2 * i))))
        per_expert_down = [WeightSource(f"{e}.down_proj.weight", (e,)) for e in range(num_experts)]
        set_sources(self, "gate_up_proj", [[WeightSource("gate_up_proj")], per_expert_gate_up])
        set_sources(self, "down_proj", [[WeightSource("down_proj")], per_expert_down])


class SparseMoeBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.top_k = config.num_experts_per_tok
        self.gate = Router(hidden, config.num_experts)
        self.experts = Experts(config.num_experts, hidden, config.moe_intermediate_size)
        self.shared_expert = MLP(hidden, config.shared_expert_intermediate_size)
        self.shared_expert_gate = Linear(hidden, 1)
        self.routed = None  # layers/routed_projection.py: the routing the mixer's projections took, if any
        self.packed = None  # layers/mma_projections.py: the experts' 12-bit copies (--mma-experts)

    def forward(self, x: torch.Tensor, norm: RMSNorm, residual: torch.Tensor) -> torch.Tensor:
        """``residual + MoE(norm(x))``, added to the residual in place."""
        return ops.fused_moe(
            x,
            self.gate.weight,
            self.experts.gate_up_proj,
            self.experts.down_proj,
            self.top_k,
            self.shared_expert.gate_up_proj.weight,
            self.shared_expert.down_proj.weight,
            self.shared_expert_gate.weight,
            norm_weight=norm.weight,
            norm_eps=norm.eps,
            residual=residual,
            routing=self.routed.take_routing() if self.routed is not None else None,
            packed=self.packed,
        )


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_type = config.layer_types[layer_idx]
        kind_index = sum(1 for t in config.layer_types[:layer_idx] if t == self.layer_type)
        if self.layer_type == FULL_ATTENTION:
            self.self_attn = Attention(config, kind_index)
        else:
            self.linear_attn = GatedDeltaNet(config, kind_index)
        if config.is_moe:
            self.mlp = SparseMoeBlock(config)
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        cache: ModelCache,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [T, hidden]: the residual stream, updated in place and returned; with ``rows`` [L] only those
        rows come out of the mixer and go on through the FFN, [L, hidden]. The mixer still takes all T rows in:
        it writes every token's KV entries or DeltaNet state."""
        if self.layer_type == FULL_ATTENTION:
            x = self.self_attn(x, self.input_layernorm, batch, cache, rope, rows)
        else:
            x = self.linear_attn(x, self.input_layernorm, batch, cache, rows)
        return self.mlp(x, self.post_attention_layernorm, residual=x)


class TextModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # see rope

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(cos, sin, positions): the RoPE tables [max_position_embeddings, rotary_dim // 2] fp32, built on the
        first forward (the engine's warm-up, before any graph capture) so that a step computes none, and the
        positions [T] the attention layers read them at."""
        c = self.config
        if self.rope_table is None or self.rope_table[0].device != positions.device:
            # built while capturing, the tables would live in the graphs' pool (overwritten between replays)
            if positions.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "the RoPE tables must be built before CUDA-graph capture: run a forward first"
                )
            every = torch.arange(c.max_position_embeddings, device=positions.device)
            self.rope_table = ops.rope_cos_sin(every, c.rotary_dim, c.rope_theta)
        return (*self.rope_table, positions)

    def forward(self, batch: ForwardBatch, cache: ModelCache) -> torch.Tensor:
        """Returns the final-normed hidden states [L, hidden] of the rows ``batch.logits_indices``.

        Nothing reads the last layer's output at the other rows, so past its KV store or state update it skips
        them: in a prefill that is the last MoE layer's expert reads (~1/40 of the prefill's) and its attention
        queries and output projection for all but the sampled tokens."""
        rope = self.rope(batch.positions)
        x = self.embed_tokens(batch.input_ids)  # [T, hidden], the residual stream
        *body, last = self.layers
        for layer in body:
            x = layer(x, batch, cache, rope)
        # logits_indices is increasing, so L == T means every row in order (decode): nothing to select
        rows = batch.logits_indices if batch.logits_indices.shape[0] < batch.num_tokens else None
        return self.norm(last(x, batch, cache, rope, rows))


class Qwen3_5ForCausalLM(nn.Module):
    """The text model and its LM head; checkpoint keys ``model.*`` and ``lm_head.weight``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = TextModel(config)
        self.lm_head = LMHead(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, batch: ForwardBatch, cache: ModelCache) -> torch.Tensor:
        """The final-normed hidden states [L, hidden] of the rows that need logits (``TextModel.forward``)."""
        return self.model(batch, cache)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [L, hidden] -> logits [L, vocab] in fp32."""
        return self.lm_head(hidden).float()

    def compute_logits_and_greedy(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``compute_logits`` and each row's argmax [L] int64 (the greedy token), in one pass over the logits."""
        return ops.logits_argmax(self.lm_head(hidden))

    def compute_greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [L, hidden] -> the greedy token of each row [L] int64, without the logits."""
        return self.lm_head.greedy(hidden)
