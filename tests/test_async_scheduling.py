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
