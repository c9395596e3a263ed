"""CUDA graphs of the whole decode step: all layers, the LM head and greedy argmax, one graph per batch size.

A decode step launches ~10 kernels per layer; replaying a captured graph removes the launch gaps that
otherwise dominate at small batches. Batches are padded up to the next captured size: padded rows read
and write only the spare KV block and state slot that ``allocate_cache`` reserves, and store no KV.

When the LM head has a greedy screen (``layers/lm_head.py``), the sizes it takes (<= 4) also get a greedy-only
graph: the same step ending in the greedy token without the logits, which a step of plain greedy requests
(no logprobs, penalties or min_tokens) replays instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from hyserve.engine.scheduler import SchedulerOutput
from hyserve.kernels.copy_words import copy_words
from hyserve.model.batch import ForwardBatch, ModelCache

log = logging.getLogger(__name__)

DEFAULT_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def capture_sizes(max_num_seqs: int) -> list[int]:
    sizes = [s for s in DEFAULT_SIZES if s < max_num_seqs]
    return sorted({*sizes, max_num_seqs})


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor | None  # [size, V] fp32, written by the replay; None in a greedy-only graph
    greedy: torch.Tensor  # [size] int64 argmax of the logits


class GraphSet:
    """What the decode and the prefill graph sets share: the model and cache the graphs run, their sizes
    (ascending), and the spare KV block and state slot that padding points at (``allocate_cache`` reserves
    them). A subclass allocates its static input buffers for the largest size in ``_allocate``."""

    def __init__(
        self,
        model: torch.nn.Module,
        cache: ModelCache,
        sizes: list[int],
        block_size: int,
        max_blocks_per_seq: int,
        spare_block: int,
        spare_slot: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.cache = cache
        self.sizes = sorted(set(sizes))
        self.block_size = block_size
        self.spare_block = spare_block
        self.spare_slot = spare_slot
        self.device = device
        self.pool = None  # the memory pool the set's captures share
        self._allocate(self.sizes[-1], max_blocks_per_seq)

    def _allocate(self, n: int, width: int) -> None:
        raise NotImplementedError


class DecodeGraphs(GraphSet):
    def _allocate(self, n: int, width: int) -> None:
        device = self.device
        # The step's inputs in one byte buffer, [rows | seq_lens32 | tables], so that a step's staging is one
        # copy kernel (each copy or cast between two replays costs the GPU ~2-5 us: 1.9 ms steps at batch 1):
        # rows [5, n] int64 (ids, pos, slot, len, state), seq_lens32 [n] int32 (len again, for the attention
        # kernels), tables [n, width] int32. Pinned host staging, two sets: with async scheduling the next
        # step's inputs are written while the previous step's copy may still be queued, so each set is reused
        # only after its copy completed.
        self.host_stage = [
            torch.zeros(staging_bytes(n, width), dtype=torch.uint8).pin_memory() for _ in range(2)
        ]
        self.host_rows, self.host_seq32, self.host_tables = zip(
            *(staging_views(h, n, width) for h in self.host_stage)
        )
        self.copied = [torch.cuda.Event(), torch.cuda.Event()]
        self.turn = 0
        self.stage = torch.zeros(staging_bytes(n, width), dtype=torch.uint8, device=device)
        self.rows, self.seq_lens32, self.tables = staging_views(self.stage, n, width)
        self.seq_lens32.fill_(1)
        self.cu = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.has_initial = torch.ones(n, dtype=torch.bool, device=device)
        self.logits_indices = torch.arange(n, dtype=torch.long, device=device)
        self.graphs: dict[int, _Captured] = {}
        self.greedy_graphs: dict[int, _Captured] = {}

    def _batch(self, size: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.rows[0, :size],
            positions=self.rows[1, :size],
            cu_seqlens_q=self.cu[: size + 1],
            seq_lens=self.seq_lens32[:size],
            block_tables=self.tables[:size],
            slot_mapping=self.rows[2, :size],
            state_indices=self.rows[4, :size],
            has_initial_state=self.has_initial[:size],
            logits_indices=self.logits_indices[:size],
            is_decode=True,
        )

    def _step(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.model(self._batch(size), self.cache)
        return self.model.compute_logits_and_greedy(hidden)

    def _greedy_step(self, size: int) -> tuple[None, torch.Tensor]:
        hidden = self.model(self._batch(size), self.cache)
        return None, self.model.compute_greedy(hidden)

    def _greedy_sizes(self) -> list[int]:
        head = getattr(self.model, "lm_head", None)
        if not getattr(head, "screens", False):
            return []
        from hyserve.kernels.greedy_head import MAX_ROWS

        return [s for s in self.sizes if s <= MAX_ROWS]

    def _pad_inputs(self) -> None:
        """Every row points at the spare block and slot: safe inputs for warm-up and capture."""
        self.rows.zero_()
        self.rows[2].fill_(-1)
        self.rows[4].fill_(self.spare_slot)
        self.seq_lens32.fill_(1)
        self.tables.fill_(self.spare_block)

    @torch.inference_mode()
    def capture(self, progress: bool = True) -> None:
        self._pad_inputs()
        steps = [(size, self._step, self.graphs) for size in self.sizes]
        steps += [(size, self._greedy_step, self.greedy_graphs) for size in self._greedy_sizes()]
        for size, step, _ in steps:  # compile every kernel variant outside the capture
            step(size)
        torch.cuda.synchronize(self.device)
        for size, step, graphs in tqdm(
            sorted(steps, key=lambda s: -s[0]), desc="Capturing CUDA graphs", disable=not progress
        ):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                logits, greedy = step(size)
            if self.pool is None:
                self.pool = graph.pool()
            graphs[size] = _Captured(graph, logits, greedy)
        torch.cuda.synchronize(self.device)
        log.info(
            "captured decode CUDA graphs for batch sizes %s (greedy-only: %s)",
            self.sizes,
            sorted(self.greedy_graphs),
        )

    def bucket(self, n: int) -> int | None:
        return next((s for s in self.sizes if s >= n), None)

    def can_run(self, out: SchedulerOutput) -> bool:
        return out.is_decode and self.bucket(len(out.scheduled)) is not None

    @torch.inference_mode()
    def run(
        self, out: SchedulerOutput, input_tokens: torch.Tensor | None = None, greedy_only: bool = False
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Replay for a decode-only step; returns (logits [n, V] fp32, greedy tokens [n]) views, the logits None
        when ``greedy_only`` found a greedy-only graph of that size. ``input_tokens`` [n] (device) replaces the
        host's input ids (a step launched ahead)."""
        n = len(out.scheduled)
        size = self.bucket(n)
        turn, self.turn = self.turn, 1 - self.turn
        self.copied[turn].synchronize()  # the copy that last read this staging set has finished
        host_rows, host_tables = self.host_rows[turn], self.host_tables[turn]
        stage_decode_inputs(
            out,
            host_rows[:, :size].numpy(),
            host_tables[:size].numpy(),
            self.block_size,
            self.spare_block,
            self.spare_slot,
            with_ids=input_tokens is None,
        )
        self.host_seq32[turn][:size].numpy()[:] = host_rows[3, :size].numpy()
        end = staging_bytes(self.rows.shape[1], self.tables.shape[1], size)
        # one kernel reads the pinned staging and lays the launched-ahead ids over rows[0, :n] (copy_words:
        # no copy-engine hop between two replays)
        overlay = None if input_tokens is None else input_tokens.contiguous()
        copy_words(self.host_stage[turn][:end], self.stage[:end], overlay=overlay)
        self.copied[turn].record()
        captured = (greedy_only and self.greedy_graphs.get(size)) or self.graphs[size]
        captured.graph.replay()
        logits = None if captured.logits is None else captured.logits[:n]
        return logits, captured.greedy[:n]


def staging_bytes(n: int, width: int, size: int | None = None) -> int:
    """Bytes of a decode staging buffer for n rows of block tables ``width`` wide (``DecodeGraphs``): rows [5, n]
    int64, seq_lens32 [n] int32, tables [n, width] int32; with ``size``, the prefix a step of that many rows
    copies (every row and length, the first ``size`` tables)."""
    return 44 * n + 4 * width * (n if size is None else size)


def staging_views(buf: torch.Tensor, n: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The parts of a staging byte buffer ``buf`` [staging_bytes(n, width)] uint8, as views: (rows [5, n] int64,
    seq_lens32 [n] int32, tables [n, width] int32)."""
    rows = buf[: 40 * n].view(torch.long).view(5, n)
    return rows, buf[40 * n : 44 * n].view(torch.int32), buf[44 * n :].view(torch.int32).view(n, width)


def stage_decode_inputs(
    out: SchedulerOutput,
    rows: np.ndarray,
    tables: np.ndarray,
    block_size: int,
    spare_block: int,
    spare_slot: int,
    with_ids: bool = True,
) -> None:
    """Write a decode step's inputs into host staging arrays, padded rows included.

    rows [5, size] int64: input id, position, KV slot, sequence length, state slot (ids are left as they
    are when ``with_ids`` is False: the device copies them from the previous step's samples). tables
    [size, width] int32: only the columns some row of this step reads are written, since a row reads
    block-table columns < ceil(length / block_size) only; the columns after them keep older valid block
    ids. Writing the whole width in Python cost ~1.5 ms a step at 32 rows x 512 columns, which is host
    time the GPU waits for once it exceeds the step.
    """
    n = len(out.scheduled)
    ids, pos, slots, states = [], [], [], []
    used = 1
    for i, entry in enumerate(out.scheduled):
        seq = entry.seq
        p = seq.num_computed_tokens
        if with_ids:
            out_idx = p - seq.num_prompt_tokens
            ids.append(seq.output_token_ids[out_idx] if out_idx >= 0 else seq.prompt_token_ids[p])
        pos.append(p)
        slots.append(seq.kv_slot(p, block_size))
        states.append(seq.state_slot)
        table = seq.block_table
        used = max(used, len(table))
        tables[i, : len(table)] = table
    for i, entry in enumerate(out.scheduled):
        tables[i, len(entry.seq.block_table) : used] = spare_block
    tables[n:, :used] = spare_block  # padded rows: length 1, column 0 only
    if with_ids:
        rows[0, :n] = ids
    rows[0, n:] = 0
    rows[1, :n] = pos
    rows[1, n:] = 0
    rows[2, :n] = slots
    rows[2, n:] = -1  # padded rows store no KV
    rows[3, :n] = rows[1, :n] + 1
    rows[3, n:] = 1
    rows[4, :n] = states
    rows[4, n:] = spare_slot
