"""CUDA graphs of a whole prefill of one new prompt: the time to first token of an idle server.

An eager prefill issues ~470 Triton launches, ~120 cuBLAS calls and ~800 allocations from Python: ~40 ms of
host time on the H200 machine whatever the length, while the kernels of a 128-token prefill take 19 ms and
those of a 1024-token one 29 ms (``scripts/profile_prefill.py --cprofile``). A graph per token bucket L
replays them in one call.

A prompt of n tokens runs in the smallest captured L >= n. n == L: one sequence, exactly the eager batch.
n < L: two sequences, the prompt and a throw-away one of L - n tokens that reads the spare KV block, stores
no KV and keeps its DeltaNet state in the spare slot (like the padded rows of the decode graphs). Tokens of
different sequences never mix (attention and the DeltaNet recurrence are per sequence; projections, norms
and the MoE per token), so the prompt's logits, KV and state are those of the unpadded prefill
(``tests/test_prefill_graphs.py`` runs the same padded forward eagerly on the CPU and compares; on the H200,
``scripts/check_prefill_graphs.py`` compares a padded replay with the eager prefill at the same token
count). Captured by default for 128, 256, ..., 4096 tokens (``--prefill-graph-sizes`` picks others, ``none``
turns them off): their memory pool holds the activations of the largest bucket.

A graph ends at the final-normed hidden state of the prompt's last token; the runner then launches the LM
head eagerly. Those few launches queue behind the replay while the GPU still prefills, so they cost the
first token nothing on the host, and the runner can pick the head per request: the greedy screen's token
for a plain greedy prompt (0.51 GB read instead of the 1.02 GB head), the logits otherwise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from hyserve.engine.cuda_graphs import GraphSet
from hyserve.engine.scheduler import SchedulerOutput
from hyserve.kernels.attention import graph_backend
from hyserve.model.batch import ForwardBatch

log = logging.getLogger(__name__)

DEFAULT_SIZES = (128, 256, 512, 1024, 2048, 4096)


def default_prefill_sizes(limit: int) -> list[int]:
    """The default buckets that fit a one-step prefill of at most ``limit`` tokens."""
    return [s for s in DEFAULT_SIZES if s <= limit]


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor  # [1, hidden] final-normed state of the prompt's last token, written by the replay


def stage_prefill_inputs(
    prompt: list[int],
    block_table: list[int],
    size: int,
    block_size: int,
    spare_block: int,
    rows: np.ndarray,
    table: np.ndarray,
) -> None:
    """Host inputs of one prompt (n tokens) padded to ``size`` tokens.

    rows [3, size] int64: input ids, positions, KV slots (the padding sequence: ids 0, positions 0..,
    slot -1). table [width] int32: the prompt's block table, the spare block past it.
    """
    n = len(prompt)
    rows[0, :n] = prompt
    rows[0, n:size] = 0
    pos = np.arange(n, dtype=np.int64)
    rows[1, :n] = pos
    rows[1, n:size] = np.arange(size - n, dtype=np.int64)
    blocks = np.asarray(block_table, dtype=np.int64)
    rows[2, :n] = blocks[pos // block_size] * block_size + pos % block_size
    rows[2, n:size] = -1
    table[: len(block_table)] = block_table
    table[len(block_table) :] = spare_block


class PrefillGraphs(GraphSet):
    def _allocate(self, n: int, width: int) -> None:
        device = self.device
        pin = device.type == "cuda"
        # host staging (one set: a prefill is never launched ahead, and ``copied`` orders reuse)
        self.host_rows = torch.zeros(3, n, dtype=torch.long, pin_memory=pin)  # ids, positions, KV slots
        self.host_table = torch.zeros(width, dtype=torch.int32, pin_memory=pin)
        self.host_small = torch.zeros(8, dtype=torch.long, pin_memory=pin)  # cu[3], lens[2], states[2], last
        self.copied = torch.cuda.Event() if pin else None
        self.rows = torch.zeros(3, n, dtype=torch.long, device=device)
        self.cu = torch.zeros(3, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(2, dtype=torch.int32, device=device)
        self.tables = torch.full((2, width), self.spare_block, dtype=torch.int32, device=device)
        self.states = torch.full((2,), self.spare_slot, dtype=torch.long, device=device)
        self.has_initial = torch.zeros(2, dtype=torch.bool, device=device)
        self.last = torch.zeros(1, dtype=torch.long, device=device)  # the prompt's last row
        self.graphs: dict[tuple[int, bool], _Captured] = {}

    def bucket(self, n: int) -> tuple[int, bool] | None:
        """(size, exact) of the graph a prompt of n tokens runs in, or None past the largest size."""
        size = next((s for s in self.sizes if s >= n), None)
        return None if size is None else (size, size == n)

    def can_run(self, out: SchedulerOutput) -> bool:
        """One new prompt, prefilled whole in this step (no cached prefix, sampled, no prompt logprobs)."""
        if len(out.scheduled) != 1:
            return False
        entry = out.scheduled[0]
        seq = entry.seq
        return (
            entry.sample
            and seq.num_computed_tokens == 0
            and not seq.wants_prompt_logprobs
            and self.bucket(entry.num_new_tokens) is not None
        )

    def _batch(self, size: int, exact: bool) -> ForwardBatch:
        nseq = 1 if exact else 2
        return ForwardBatch(
            input_ids=self.rows[0, :size],
            positions=self.rows[1, :size],
            cu_seqlens_q=self.cu[: nseq + 1],
            seq_lens=self.seq_lens[:nseq],
            block_tables=self.tables[:nseq],
            slot_mapping=self.rows[2, :size],
            state_indices=self.states[:nseq],
            has_initial_state=self.has_initial[:nseq],
            logits_indices=self.last,
            is_decode=False,
            causal_rows=True,  # can_run: no cached prefix; the padding sequence comes after the prompt
        )

    def forward(self, size: int, exact: bool) -> torch.Tensor:
        """The padded prefill on the staged inputs -> hidden [1, hidden] of the prompt's last token (what a
        graph captures)."""
        return self.model(self._batch(size, exact), self.cache)

    def stage(self, out: SchedulerOutput) -> tuple[int, bool]:
        """Copy the step's prompt into the graph inputs; returns its (size, exact) bucket."""
        seq = out.scheduled[0].seq
        n = out.scheduled[0].num_new_tokens
        size, exact = self.bucket(n)
        if self.copied is not None:
            self.copied.synchronize()  # the previous prefill's copies have read the staging buffers
        rows = self.host_rows.numpy()
        stage_prefill_inputs(
            seq.all_token_ids[:n],
            seq.block_table,
            size,
            self.block_size,
            self.spare_block,
            rows,
            self.host_table.numpy(),
        )
        self.host_small.copy_(torch.tensor([0, n, size, n, size - n, seq.state_slot, self.spare_slot, n - 1]))
        blocking = self.copied is None
        self.rows.copy_(self.host_rows, non_blocking=not blocking)  # whole rows: one contiguous copy
        self.tables[0].copy_(self.host_table, non_blocking=not blocking)
        small = self.host_small.to(self.device, non_blocking=not blocking)
        self.cu.copy_(small[0:3])
        self.seq_lens.copy_(small[3:5])
        self.states.copy_(small[5:7])
        self.last.copy_(small[7:8])
        if self.copied is not None:
            self.copied.record()
        return size, exact

    def run(self, out: SchedulerOutput) -> torch.Tensor:
        """Stage and replay (eagerly when that bucket has no graph) -> hidden [1, hidden] of the prompt's
        last token, valid until the next replay."""
        size, exact = self.stage(out)
        captured = self.graphs.get((size, exact))
        if captured is None:
            return self.forward(size, exact)
        captured.graph.replay()
        return captured.hidden

    def _safe_inputs(self, size: int) -> None:
        """Both sequences on the spare block and slot: inputs for warm-up and capture."""
        self.rows.zero_()
        self.rows[1, :size] = torch.arange(size, device=self.device)
        self.rows[2].fill_(-1)
        self.cu.copy_(torch.tensor([0, size // 2, size], dtype=torch.int32))
        self.seq_lens.copy_(torch.tensor([size // 2, size - size // 2], dtype=torch.int32))
        self.tables.fill_(self.spare_block)
        self.states.fill_(self.spare_slot)
        self.last.fill_(0)

    @torch.inference_mode()
    def capture(self, progress: bool = True) -> None:
        """Run every (size, exact) variant once eagerly (compiles kernels, allocates every lazily created
        buffer outside the capture), then capture them, largest first, in one shared pool. Both under
        ``graph_backend()``: the prompt's attention on cuDNN, its plan per bucket built in the eager run (a
        process's first cuDNN call cannot be captured)."""
        with graph_backend():
            variants = [(s, e) for s in sorted(self.sizes, reverse=True) for e in (True, False)]
            for size, exact in variants:
                self._safe_inputs(size)
                if exact:
                    self.cu[1] = size
                    self.seq_lens[0] = size
                self.forward(size, exact)
            torch.cuda.synchronize(self.device)
            for size, exact in tqdm(variants, desc="Capturing prefill graphs", disable=not progress):
                self._safe_inputs(size)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    hidden = self.forward(size, exact)
                if self.pool is None:
                    self.pool = graph.pool()
                self.graphs[(size, exact)] = _Captured(graph, hidden)
            torch.cuda.synchronize(self.device)
        log.info("captured prefill CUDA graphs for %s tokens", self.sizes)
