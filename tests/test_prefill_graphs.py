"""Whole-prefill graphs (engine/prefill_graphs.py): the padded prefill they capture must give the prompt the
logits, KV and DeltaNet state of the plain prefill. The CPU cannot capture, so the runner here replays the
same padded forward eagerly (what a bucket without a graph does)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from checkpoints import make_checkpoint
from hyserve import LLM, SamplingParams
from hyserve.engine.prefill_graphs import PrefillGraphs, default_prefill_sizes, stage_prefill_inputs
from hyserve.engine.scheduler import ScheduledSequence, SchedulerOutput
from hyserve.engine.sequence import Sequence

SIZES = [8, 24, 40]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("prefill-graphs"), seed=21)


def _with_prefill_graphs(llm: LLM) -> PrefillGraphs:
    runner = llm.engine.runner
    runner.prefill_graphs = runner.graph_set(PrefillGraphs, SIZES, llm.engine.max_model_len)
    return runner.prefill_graphs


def test_stage_pads_with_a_sequence_that_stores_nothing():
    rows = np.full((3, 12), 99, dtype=np.int64)
    table = np.full(6, 99, dtype=np.int32)
    stage_prefill_inputs(
        [5, 6, 7, 8, 9], [3, 1], size=8, block_size=4, spare_block=50, rows=rows, table=table
    )
    assert rows[0, :8].tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    assert rows[1, :8].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]  # the padding sequence starts at position 0
    assert rows[2, :8].tolist() == [12, 13, 14, 15, 4, -1, -1, -1]  # block 3 then block 1; padding: no KV
    assert table.tolist() == [3, 1, 50, 50, 50, 50]
    assert rows[:, 8:].tolist() == [[99] * 4] * 3  # past the bucket: untouched


def test_bucket_and_which_steps_run(model_dir):
    llm = LLM(str(model_dir), device="cpu", progress=False, max_model_len=128)
    graphs = _with_prefill_graphs(llm)
    assert graphs.bucket(8) == (8, True)
    assert graphs.bucket(9) == (24, False)
    assert graphs.bucket(41) is None

    def out_for(n: int, computed: int = 0, sample: bool = True, **kw) -> SchedulerOutput:
        seq = Sequence("r", list(range(1, n + 1)), SamplingParams(max_tokens=2, **kw))
        seq.num_computed_tokens = computed
        return SchedulerOutput([ScheduledSequence(seq, n - computed, sample=sample)])

    assert graphs.can_run(out_for(20))
    assert not graphs.can_run(out_for(50))  # longer than every bucket
    assert not graphs.can_run(out_for(20, computed=4))  # a cached prefix
    assert not graphs.can_run(out_for(20, sample=False))  # a chunk of a longer prompt
    assert not graphs.can_run(out_for(20, prompt_logprobs=1))
    two = out_for(5)
    two.scheduled.append(out_for(6).scheduled[0])
    assert not graphs.can_run(two)


def test_padded_prefill_gives_the_plain_prefills_tokens_and_logprobs(model_dir):
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in (8, 5, 24, 17, 33, 40, 52)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
    results = {}
    for padded in (False, True):
        llm = LLM(str(model_dir), device="cpu", progress=False, max_model_len=128)
        ran = []
        if padded:
            graphs = _with_prefill_graphs(llm)
            run = graphs.run
            graphs.run = lambda out, run=run, ran=ran: ran.append(out.scheduled[0].num_new_tokens) or run(out)
        outs = [llm.generate(p, params)[0].outputs[0] for p in prompts]  # one at a time: a lone prefill
        results[padded] = outs
        if padded:
            assert ran == [8, 5, 24, 17, 33, 40]  # 52 is past the largest bucket: eager
    for plain, padded in zip(results[False], results[True]):
        assert padded.token_ids == plain.token_ids  # decode reads the KV and state the prefill wrote
        for (chosen_a, top_a), (chosen_b, top_b) in zip(plain.logprobs, padded.logprobs):
            assert abs(chosen_a - chosen_b) < 1e-4
            assert [t for t, _ in top_a] == [t for t, _ in top_b]
            assert max(abs(x - y) for (_, x), (_, y) in zip(top_a, top_b)) < 1e-4


def test_a_plain_greedy_prompt_takes_the_greedy_head(model_dir):
    """The graph ends at the hidden state; the runner's head gives a plain greedy prompt the greedy screen's
    token (the full head's, by construction) and a prompt with logprobs the logits."""
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in (8, 13, 30)]
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    plain = LLM(str(model_dir), device="cpu", progress=False, max_model_len=128)
    want = [plain.generate(p, greedy)[0].outputs[0].token_ids for p in prompts]
    llm = LLM(str(model_dir), device="cpu", progress=False, max_model_len=128)
    model = llm.engine.model
    model.lm_head.prepare_greedy_screen()
    _with_prefill_graphs(llm)
    heads = []
    for name in ("compute_greedy", "compute_logits"):
        f = getattr(model, name)
        setattr(model, name, lambda h, f=f, name=name: heads.append((name, h.shape[0])) or f(h))
    got = [llm.generate(p, greedy)[0].outputs[0].token_ids for p in prompts]
    assert got == want
    # per prompt: the prefill's greedy token through the screen, then two eager decode steps' logits
    assert heads == [("compute_greedy", 1), ("compute_logits", 1), ("compute_logits", 1)] * 3
    heads.clear()
    with_logprobs = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=2)
    out = llm.generate(prompts[0], with_logprobs)[0].outputs[0]
    assert out.token_ids == want[0][:1] and heads == [("compute_logits", 1)]


def test_bad_sizes_are_refused(model_dir):
    import argparse

    from hyserve.engine.args import add_engine_arguments, engine_args_from

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    for bad in ("128,x", "0,64"):
        with pytest.raises(ValueError, match="--prefill-graph-sizes"):
            engine_args_from(parser.parse_args(["--prefill-graph-sizes", bad]))
    assert engine_args_from(parser.parse_args(["--prefill-graph-sizes", "64,128"])).prefill_graph_sizes == [
        64,
        128,
    ]
    assert engine_args_from(parser.parse_args(["--prefill-graph-sizes", "none"])).prefill_graph_sizes == []
    assert engine_args_from(parser.parse_args([])).prefill_graph_sizes is None  # the default buckets
    assert default_prefill_sizes(1000) == [128, 256, 512]
    with pytest.raises(ValueError, match="prefill graph size 512 is outside 1..127"):
        LLM(str(model_dir), device="cpu", progress=False, max_model_len=128, prefill_graph_sizes=[64, 512])


def test_warm_up_and_capture_both_run_under_graph_backend(model_dir, monkeypatch):
    """The prompt's attention takes cuDNN in the graphs, and a process's first cuDNN call cannot be captured
    (H100, 2026-12-06), so the eager warm-up of every bucket must run under ``graph_backend()`` as well as its
    capture. The CPU cannot capture: the CUDA graph calls are stand-ins here, the forward a recorder."""
    import contextlib

    from hyserve.kernels.attention import causal

    class FakeGraph:
        def pool(self) -> tuple[int, int]:
            return (0, 0)

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, pool=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    graphs = _with_prefill_graphs(LLM(str(model_dir), device="cpu", progress=False, max_model_len=128))
    seen = []
    monkeypatch.setattr(
        graphs, "forward", lambda size, exact: seen.append((size, exact, causal._graph_backend))
    )
    graphs.capture(progress=False)
    variants = [(s, e) for s in sorted(SIZES, reverse=True) for e in (True, False)]
    assert seen == [(s, e, True) for s, e in variants] * 2  # the warm-up, then the capture
    assert sorted(graphs.graphs) == sorted(variants) and not causal._graph_backend
