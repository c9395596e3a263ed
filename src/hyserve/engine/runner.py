"""The model runner: owns the device caches, turns a ``SchedulerOutput`` into a ``ForwardBatch``, runs the
model and samples."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from hyserve.config import ModelConfig
from hyserve.engine.cache_manager import CacheConfig
from hyserve.engine.sampler import DeviceSample, sample_on_device, writes_logits
from hyserve.engine.scheduler import SchedulerOutput
from hyserve.engine.sequence import Sequence
from hyserve.model.batch import ForwardBatch, ModelCache

log = logging.getLogger(__name__)


@dataclass
class PendingStep:
    """A launched step: its schedule, and the sampled tokens still on the device."""

    out: SchedulerOutput
    seqs: list[Sequence]  # the sequences that sample this step, in the rows of ``sampled``
    sampled: DeviceSample | None
    result: RunnerOutput  # prompt logprobs are already filled in

    def wait(self) -> RunnerOutput:
        """Block until the step is done and read its tokens to the host."""
        if self.sampled is not None:
            host = self.sampled.to_host(self.seqs)
            for i, seq in enumerate(self.seqs):
                self.result.sampled[seq.seq_id] = host.token_ids[i]
                if host.logprobs is not None and seq.params.logprobs is not None:
                    self.result.logprobs[seq.seq_id] = (host.logprobs[i], host.top_logprobs[i])
        return self.result


@dataclass
class RunnerOutput:
    """Results of one step, keyed by ``Sequence.seq_id``."""

    sampled: dict[int, int]  # next token of each sequence whose chunk reached its end
    logprobs: dict[int, tuple[float, list[tuple[int, float]]]]  # chosen logprob, top alternatives
    # prompt logprobs computed this step: per sequence, entries for prompt positions 1.. in order
    prompt_logprobs: dict[int, list[tuple[float, list[tuple[int, float]]]]]


def cache_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes of one KV block over all attention layers, bytes of one DeltaNet state slot over all layers)."""
    item = torch.empty((), dtype=dtype).element_size()
    n_full, n_linear = len(config.full_attention_layers), len(config.linear_attention_layers)
    block = n_full * 2 * block_size * config.num_key_value_heads * config.head_dim * item
    conv = (config.linear_conv_kernel_dim - 1) * config.linear_conv_dim * item
    ssm = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * 4
    return block, n_linear * (conv + ssm)


def allocate_cache(
    config: ModelConfig, cache_config: CacheConfig, device: torch.device, dtype: torch.dtype
) -> ModelCache:
    """One spare KV block (id ``num_blocks``) and one spare state slot (id ``num_state_slots``) beyond what
    the cache manager hands out: padded rows of a CUDA-graph batch point there."""
    n_full, n_linear = len(config.full_attention_layers), len(config.linear_attention_layers)
    kv_shape = (
        cache_config.num_blocks + 1,
        cache_config.block_size,
        config.num_key_value_heads,
        config.head_dim,
    )
    kv = [
        (torch.zeros(kv_shape, dtype=dtype, device=device), torch.zeros(kv_shape, dtype=dtype, device=device))
        for _ in range(n_full)
    ]
    slots = cache_config.num_state_slots + 1
    conv = torch.zeros(
        n_linear, slots, config.linear_conv_kernel_dim - 1, config.linear_conv_dim, dtype=dtype, device=device
    )
    ssm = torch.zeros(
        n_linear,
        slots,
        config.linear_num_value_heads,
        config.linear_key_head_dim,
        config.linear_value_head_dim,
        dtype=torch.float32,
        device=device,
    )
    return ModelCache(kv=kv, conv_state=conv, ssm_state=ssm)


def _plain_greedy(seqs: list[Sequence], offset: int) -> bool:
    """Whether every sequence only needs its greedy token: no sampling, logprobs, penalties or masked stops
    (so the LM head's greedy screen may replace the logits)."""
    return all(s.params.greedy and s.params.logprobs is None and not writes_logits(s, offset) for s in seqs)


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        config: ModelConfig,
        cache_config: CacheConfig,
        device: torch.device,
        dtype: torch.dtype,
        eos_token_ids: tuple[int, ...],
    ) -> None:
        self.model = model
        self.config = config
        self.cache_config = cache_config
        self.device = device
        self.dtype = dtype
        self.eos_token_ids = eos_token_ids
        self.cache = allocate_cache(config, cache_config, device, dtype)
        self.graphs = None
        self.prefill_graphs = None  # engine/prefill_graphs.py (captured by LLMEngine unless turned off)

    def capture_graphs(self, sizes: list[int], max_model_len: int, progress: bool = True) -> None:
        """Capture the decode step for these batch sizes; on failure stay eager (and say why)."""
        from hyserve.engine.cuda_graphs import DecodeGraphs

        self.graphs = self._capture(DecodeGraphs, sizes, max_model_len, progress, "decoding")

    def capture_prefill_graphs(self, sizes: list[int], max_model_len: int, progress: bool = True) -> None:
        """Capture whole-prefill graphs for these prompt lengths; on failure prefill eagerly (and say why)."""
        from hyserve.engine.prefill_graphs import PrefillGraphs

        self.prefill_graphs = self._capture(PrefillGraphs, sizes, max_model_len, progress, "prefilling")

    def graph_set(self, cls, sizes: list[int], max_model_len: int):
        """A ``DecodeGraphs`` or ``PrefillGraphs`` over this runner's model and cache, not captured yet."""
        bs = self.cache_config.block_size
        return cls(
            self.model,
            self.cache,
            sizes,
            block_size=bs,
            max_blocks_per_seq=-(-max_model_len // bs),
            spare_block=self.cache_config.num_blocks,
            spare_slot=self.cache_config.num_state_slots,
            device=self.device,
        )

    def _capture(self, cls, sizes: list[int], max_model_len: int, progress: bool, what: str):
        """``graph_set(...)`` captured, or None if that failed."""
        graphs = self.graph_set(cls, sizes, max_model_len)
        try:
            graphs.capture(progress)
        except RuntimeError as e:
            log.warning("CUDA graph capture failed, %s eagerly: %s", what, str(e).splitlines()[0])
            torch.cuda.synchronize(self.device)
            return None
        return graphs

    def prepare(self, out: SchedulerOutput, all_logits: bool = False) -> ForwardBatch:
        """Pack the scheduled chunks. ``all_logits``: logits for every new token, not just the last."""
        block_size = self.cache_config.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        seq_lens, state_indices, has_initial, logits_rows = [], [], [], []
        max_blocks = max(len(e.seq.block_table) for e in out.scheduled)
        tables = []
        for entry in out.scheduled:
            seq, start, n = entry.seq, entry.seq.num_computed_tokens, entry.num_new_tokens
            tokens = seq.all_token_ids
            input_ids.extend(tokens[start : start + n])
            table = seq.block_table
            for pos in range(start, start + n):
                positions.append(pos)
                slots.append(seq.kv_slot(pos, block_size))
            if all_logits or seq.wants_prompt_logprobs:
                logits_rows.extend(range(cu[-1], cu[-1] + n))
            elif entry.sample:
                logits_rows.append(cu[-1] + n - 1)
            cu.append(cu[-1] + n)
            seq_lens.append(start + n)
            state_indices.append(seq.state_slot)
            has_initial.append(start > 0)
            tables.append(table + [-1] * (max_blocks - len(table)))

        def tensor(values, dtype):
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        return ForwardBatch(
            input_ids=tensor(input_ids, torch.long),
            positions=tensor(positions, torch.long),
            cu_seqlens_q=tensor(cu, torch.int32),
            seq_lens=tensor(seq_lens, torch.int32),
            block_tables=tensor(tables, torch.int32),
            slot_mapping=tensor(slots, torch.long),
            state_indices=tensor(state_indices, torch.long),
            has_initial_state=tensor(has_initial, torch.bool),
            logits_indices=tensor(logits_rows, torch.long),
            is_decode=out.is_decode,
            causal_rows=len(out.scheduled) == 1 and not out.is_decode and not has_initial[0],
        )

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        return self.launch(out).wait()

    @torch.inference_mode()
    def launch(
        self, out: SchedulerOutput, input_tokens: torch.Tensor | None = None, offset: int = 0
    ) -> PendingStep:
        """Queue one step on the device without waiting for it.

        ``input_tokens`` [n] (device): the input token of each scheduled decode row, when the host does not
        know it yet (the previous step is still running); ``offset`` is then 1 for the sampler.
        """
        if self.graphs is not None and self.graphs.can_run(out):
            return self._launch_graph(out, input_tokens, offset)
        if self.prefill_graphs is not None and self.prefill_graphs.can_run(out):
            seqs = [out.scheduled[0].seq]
            hidden = self.prefill_graphs.run(out)  # [1, hidden]
            if _plain_greedy(seqs, offset):
                sampled = DeviceSample(self.model.compute_greedy(hidden))
            else:
                sampled = self._sample(self.model.compute_logits(hidden), seqs, offset)
            sampled.start_copy()
            return PendingStep(out, seqs, sampled, RunnerOutput({}, {}, {}))
        batch = self.prepare(out)
        if input_tokens is not None:
            batch.input_ids = input_tokens
        hidden = self.model(batch, self.cache)
        logits = self.model.compute_logits(hidden)  # [L, V] fp32
        result = RunnerOutput({}, {}, {})
        rows, sample_seqs, cursor = [], [], 0
        for entry in out.scheduled:
            seq = entry.seq
            if seq.wants_prompt_logprobs:
                n = entry.num_new_tokens
                self._prompt_logprobs(seq, logits[cursor : cursor + n], result)
                if entry.sample:
                    rows.append(cursor + n - 1)
                    sample_seqs.append(seq)
                cursor += n
            elif entry.sample:
                rows.append(cursor)
                sample_seqs.append(seq)
                cursor += 1
        sampled = self._sample(logits[rows], sample_seqs, offset) if sample_seqs else None
        if sampled is not None:
            sampled.start_copy()
        return PendingStep(out, sample_seqs, sampled, result)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], offset: int) -> DeviceSample:
        wanted = [s.params.logprobs for s in seqs if s.params.logprobs is not None]
        return sample_on_device(logits, seqs, self.eos_token_ids, max(wanted) if wanted else None, offset)

    def _launch_graph(
        self, out: SchedulerOutput, input_tokens: torch.Tensor | None, offset: int
    ) -> PendingStep:
        seqs = [e.seq for e in out.scheduled]
        plain = _plain_greedy(seqs, offset)
        logits, greedy = self.graphs.run(out, input_tokens, greedy_only=plain)
        # The benchmark case: the argmax came out of the graph. The next replay (possibly launched before the host
        # reads this one) overwrites the graph's output buffer, but everything that reads it is queued before
        # that replay: the host copy right here, and the next step's input copy (``input_tokens``).
        sampled = DeviceSample(greedy) if plain else self._sample(logits, seqs, offset)
        sampled.start_copy()
        return PendingStep(out, seqs, sampled, RunnerOutput({}, {}, {}))

    @torch.inference_mode()
    def score(self, out: SchedulerOutput) -> list[torch.Tensor]:
        """Teacher-forced logits [num_new_tokens, V] (fp32) of every scheduled chunk; nothing is sampled."""
        batch = self.prepare(out, all_logits=True)
        logits = self.model.compute_logits(self.model(batch, self.cache))
        sizes = [e.num_new_tokens for e in out.scheduled]
        return list(logits.split(sizes))

    @staticmethod
    def _prompt_logprobs(seq, logits: torch.Tensor, result: RunnerOutput) -> None:
        """logits [n, V] of this chunk's positions; position p scores prompt token p + 1."""
        start = seq.num_computed_tokens
        targets = seq.prompt_token_ids[start + 1 : start + 1 + logits.shape[0]]
        if not targets:
            return
        logprobs = logits[: len(targets)].log_softmax(-1)
        chosen = logprobs.gather(1, torch.tensor(targets, device=logits.device)[:, None])[:, 0].tolist()
        k = seq.params.prompt_logprobs or 0
        entries = []
        if k > 0:
            values, ids = logprobs.topk(k, dim=-1)
            for c, v, t in zip(chosen, values.tolist(), ids.tolist()):
                entries.append((c, list(zip(t, v))))
        else:
            entries = [(c, []) for c in chosen]
        # a preempted sequence recomputes its prompt: report only positions not scored before
        entries = entries[max(0, len(seq.prompt_logprobs) - start) :]
        seq.prompt_logprobs.extend(entries)
        if entries:
            result.prompt_logprobs[seq.seq_id] = entries
