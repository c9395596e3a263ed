"""The host staging of a graph-replayed decode step (``stage_decode_inputs``) against a plain rebuild."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from checkpoints import make_checkpoint
from hyserve import LLM
from hyserve.engine.cuda_graphs import stage_decode_inputs, staging_bytes, staging_views
from hyserve.engine.sampling_params import SamplingParams
from hyserve.engine.scheduler import ScheduledSequence, SchedulerOutput
from hyserve.engine.sequence import Sequence

BS, SPARE_BLOCK, SPARE_SLOT, WIDTH = 4, 999, 77, 12


def _seqs(rng: random.Random, n: int) -> list[Sequence]:
    seqs = []
    for i in range(n):
        prompt = [rng.randrange(100) for _ in range(rng.randint(1, 20))]
        seq = Sequence(f"r{i}", prompt, SamplingParams(max_tokens=8))
        seq.output_token_ids = [rng.randrange(100) for _ in range(rng.randint(0, 6))]
        seq.num_computed_tokens = seq.num_tokens - 1
        seq.block_table = rng.sample(range(500), -(-seq.num_tokens // BS))
        seq.state_slot = i
        seqs.append(seq)
    return seqs


def test_staging_matches_a_plain_rebuild_and_keeps_read_columns_exact():
    rng = random.Random(0)
    rows = np.full((5, 8), -5, dtype=np.int64)
    tables = np.zeros((8, WIDTH), dtype=np.int32)  # as DecodeGraphs allocates it: block 0 is valid
    for n, size in ((8, 8), (3, 4), (1, 1), (5, 8)):  # shrinking batches reuse the same buffers
        seqs = _seqs(rng, n)
        out = SchedulerOutput([ScheduledSequence(s, 1, sample=True) for s in seqs])
        stage_decode_inputs(out, rows[:, :size], tables[:size], BS, SPARE_BLOCK, SPARE_SLOT)
        for i, seq in enumerate(seqs):
            p = seq.num_computed_tokens
            assert rows[0, i] == seq.all_token_ids[p]
            assert rows[1, i] == p and rows[3, i] == p + 1 and rows[4, i] == i
            assert rows[2, i] == seq.block_table[p // BS] * BS + p % BS
            read = -(-(p + 1) // BS)  # columns the attention reads for this row
            assert list(tables[i, :read]) == seq.block_table[:read]
        for i in range(n, size):  # padded rows: spare slot and block, no KV store, length 1
            assert list(rows[:, i]) == [0, 0, -1, 1, SPARE_SLOT]
            assert tables[i, 0] == SPARE_BLOCK
        assert (tables[:size] >= 0).all(), "every column holds a block id, even stale ones"


def test_staging_leaves_ids_alone_when_the_device_supplies_them():
    seqs = _seqs(random.Random(1), 2)
    rows = np.full((5, 2), 42, dtype=np.int64)
    tables = np.zeros((2, WIDTH), dtype=np.int32)
    out = SchedulerOutput([ScheduledSequence(s, 1, sample=True) for s in seqs])
    stage_decode_inputs(out, rows, tables, BS, SPARE_BLOCK, SPARE_SLOT, with_ids=False)
    assert list(rows[0]) == [42, 42]


def test_one_copy_of_the_staging_prefix_carries_a_step():
    """DecodeGraphs copies one byte prefix of its staging buffer: every row and length, the step's tables."""
    n, width, size = 8, WIDTH, 4
    host = torch.zeros(staging_bytes(n, width), dtype=torch.uint8)
    dev = torch.full_like(host, 0xFF)
    h_rows, h_seq, h_tables = staging_views(host, n, width)
    d_rows, d_seq, d_tables = staging_views(dev, n, width)
    assert h_rows.data_ptr() == host.data_ptr() and h_tables.shape == (n, width)
    out = SchedulerOutput([ScheduledSequence(s, 1, sample=True) for s in _seqs(random.Random(2), 3)])
    stage_decode_inputs(out, h_rows[:, :size].numpy(), h_tables[:size].numpy(), BS, SPARE_BLOCK, SPARE_SLOT)
    h_seq[:size].numpy()[:] = h_rows[3, :size].numpy()
    end = staging_bytes(n, width, size)
    dev[:end].copy_(host[:end])
    assert torch.equal(d_rows[:, :size], h_rows[:, :size])
    assert torch.equal(d_seq[:size], h_rows[3, :size].int())
    assert torch.equal(d_tables[:size], h_tables[:size])
    assert (d_tables[size:].view(torch.uint8) == 0xFF).all(), "the tables past the step are not copied"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replays_with_launched_ahead_steps_match_eager_steps(tmp_path):
    """The staging kernel end to end: replayed steps (inputs read from pinned memory, launched-ahead ids laid
    over them, tokens written back by ``copy_words``) give the eager steps' tokens while the batch shrinks from 5
    rows to 1 as requests finish (rows move), one of them with logprobs (the full graph and the sampler)."""
    model_dir = make_checkpoint(tmp_path, seed=5)
    prompts = [[5, 9, 13, 200], [7, 7, 7], [300, 2, 18, 44, 61], [1, 2], [90, 91, 92, 93, 94, 95]]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (3, 17, 9, 12, 6)]
    params[2] = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, logprobs=2)
    outs = {}
    for eager in (True, False):
        # a graph for every batch size the run meets (no padding: the eager step's plans and bits); the
        # options that enforce_eager turns off are off in both runs
        llm = LLM(str(model_dir), device="cuda", progress=False, max_num_seqs=8, kv_cache_memory_gb=1,
                  enforce_eager=eager, cuda_graph_sizes=[1, 2, 3, 4, 5], prefill_graph_sizes=[], warmup=False,
                  greedy_screen=False, routed_projections=False)  # fmt: skip
        assert (llm.engine.runner.graphs is None) == eager
        got = llm.generate(prompts, params)
        outs[eager] = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in got]
        del llm
    assert [t for t, _ in outs[False]] == [t for t, _ in outs[True]]
    assert outs[False][2][1] is not None and len(outs[False][2][1]) == 9
