"""Launching decode steps ahead of the host must not change a single token."""

from __future__ import annotations

import pytest
import torch

from checkpoints import make_checkpoint
from hyserve import LLM, SamplingParams


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("async"), seed=11)


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=5, max_tokens=14, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=6, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=list(range(0, 512, 3)), min_tokens=2),
        SamplingParams(temperature=1.0, seed=9, n=2, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
    ]


def test_async_scheduling_gives_the_same_outputs(model_dir):
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in (5, 9, 30, 2, 17, 11, 4)]
    results = {}
    for mode in (True, False):
        llm = LLM(str(model_dir), device="cpu", progress=False, max_model_len=256, async_scheduling=mode)
        outs = llm.generate(prompts, _params())
        results[mode] = [
            [(c.token_ids, c.finish_reason, c.stop_reason, c.logprobs) for c in o.outputs] for o in outs
        ]
        assert not llm.engine.requests and llm.engine._pending is None
        assert llm.engine.cache_manager.num_free_slots == llm.engine.cache_manager.config.num_state_slots
        assert llm.engine.cache_manager.num_free_blocks == llm.engine.cache_manager.config.num_blocks
    assert results[True] == results[False]


def test_full_batch_with_a_queue_still_launches_ahead(model_dir, monkeypatch):
    """max_num_seqs 2, six requests: while the two slots are full and a queue waits, decode steps are still
    launched ahead (except when a sequence's length limit frees a slot), with unchanged outputs."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in (6, 3, 12, 8, 5, 9)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (7, 11, 4, 9, 6, 8)]
    results, ahead_with_queue = {}, []
    for mode in (True, False):
        llm = LLM(
            str(model_dir),
            device="cpu",
            progress=False,
            max_model_len=256,
            max_num_seqs=2,
            async_scheduling=mode,
        )
        engine = llm.engine
        launch = engine.runner.launch

        def spy(out, input_tokens=None, offset=0, engine=engine, launch=launch):
            if input_tokens is not None:
                if engine.scheduler.waiting:
                    ahead_with_queue.append(len(engine.scheduler.waiting))
                    assert len(engine.scheduler.running) == 2  # no slot was free for the queue
            return launch(out, input_tokens=input_tokens, offset=offset)

        monkeypatch.setattr(engine.runner, "launch", spy)
        results[mode] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        assert not engine.requests and engine._pending is None
    assert results[True] == results[False]
    assert ahead_with_queue
