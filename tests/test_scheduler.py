"""The scheduler and cache manager alone: CPU-only logic, no model."""

from __future__ import annotations

import random

import pytest

from hyserve.engine.cache_manager import CacheConfig, CacheManager
from hyserve.engine.sampling_params import SamplingParams
from hyserve.engine.scheduler import Scheduler, SchedulerConfig
from hyserve.engine.sequence import Sequence, SequenceStatus


def _make(num_blocks=64, block_size=4, slots=8, max_seqs=8, budget=32, max_len=256):
    cache = CacheManager(CacheConfig(block_size=block_size, num_blocks=num_blocks, num_state_slots=slots))
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=max_len), cache
    )
    return sched, cache


def _seq(n, rid="r", max_tokens=8):
    return Sequence(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens))


def _run_step(sched: Scheduler, token: int = 7):
    """Pretend the model ran: commit computed tokens, append a token where sampled."""
    out = sched.schedule()
    sched.update_computed(out)
    for e in out.scheduled:
        if e.sample:
            e.seq.output_token_ids.append(token)
    return out


def test_chunked_prefill_respects_budget_and_mixes_with_decode():
    sched, _ = _make(budget=16)
    a, b = _seq(5, "a"), _seq(40, "b")
    sched.add(a)
    sched.add(b)
    out = _run_step(sched)
    assert [(e.seq.request_id, e.num_new_tokens, e.sample) for e in out.scheduled] == [
        ("a", 5, True),
        ("b", 11, False),
    ]
    out = _run_step(sched)
    # a decodes one token, b gets the rest of the budget
    assert [(e.seq.request_id, e.num_new_tokens) for e in out.scheduled] == [("a", 1), ("b", 15)]
    assert not out.is_decode
    out = _run_step(sched)
    assert [(e.seq.request_id, e.num_new_tokens, e.sample) for e in out.scheduled] == [
        ("a", 1, True),
        ("b", 14, True),
    ]
    out = _run_step(sched)
    assert out.is_decode and out.num_tokens == 2


def test_max_num_seqs_and_fcfs():
    sched, _ = _make(max_seqs=2, budget=100)
    seqs = [_seq(3, f"s{i}") for i in range(4)]
    for s in seqs:
        sched.add(s)
    out = sched.schedule()
    assert [e.seq.request_id for e in out.scheduled] == ["s0", "s1"]
    assert [s.request_id for s in sched.waiting] == ["s2", "s3"]


def test_preempts_newest_when_blocks_run_out_and_frees_everything():
    sched, cache = _make(num_blocks=6, block_size=4, budget=64)
    old, new = _seq(8, "old"), _seq(8, "new")  # 2 blocks each after the prefill
    sched.add(old)
    sched.add(new)
    _run_step(sched)
    # each decode step adds a token; at 13 tokens both need a 4th block, but only 6 exist
    for _ in range(4):
        out = _run_step(sched)
        assert not out.preempted and [e.seq.request_id for e in out.scheduled] == ["old", "new"]
    out = _run_step(sched)
    assert [s.request_id for s in out.preempted] == ["new"]
    assert [e.seq.request_id for e in out.scheduled] == ["old"]
    assert new.block_table == [] and new.state_slot is None and new.num_computed_tokens == 0
    assert list(sched.waiting) == [new] and new.status is SequenceStatus.WAITING
    sched.finish(old, SequenceStatus.FINISHED_LENGTH)
    sched.abort(new)
    assert cache.num_free_blocks == 6 and cache.num_free_slots == 8


def test_a_preempted_sequence_is_recomputed_with_its_outputs():
    sched, cache = _make(num_blocks=5, block_size=4, budget=64, max_seqs=4)
    a, b = _seq(8, "a"), _seq(8, "b")
    sched.add(a)
    sched.add(b)
    preempted = []
    for _ in range(12):
        out = _run_step(sched)
        preempted += out.preempted
        for e in list(sched.running):
            if len(e.output_token_ids) >= 6:
                sched.finish(e, SequenceStatus.FINISHED_LENGTH)
        if not sched.num_unfinished:
            break
    assert preempted, "the cache was meant to be too small for both"
    assert len(a.output_token_ids) == 6 and len(b.output_token_ids) == 6
    assert cache.num_free_blocks == 5


def test_rejects_prompts_beyond_model_length():
    sched, _ = _make(max_len=16)
    with pytest.raises(ValueError, match="model length"):
        sched.add(_seq(16))


def test_random_workload_never_leaks():
    rng = random.Random(0)
    sched, cache = _make(num_blocks=40, block_size=4, slots=6, max_seqs=6, budget=24)
    live = []
    for step in range(400):
        if rng.random() < 0.3:
            s = _seq(rng.randint(1, 30), f"r{step}", max_tokens=rng.randint(1, 10))
            sched.add(s)
            live.append(s)
        _run_step(sched)
        for s in list(sched.running):
            if len(s.output_token_ids) >= s.params.max_tokens:
                sched.finish(s, SequenceStatus.FINISHED_LENGTH)
        if live and rng.random() < 0.05:
            victim = rng.choice(live)
            if not victim.status.finished:
                sched.abort(victim)
        used_blocks = sum(len(s.block_table) for s in sched.running)
        assert used_blocks + cache.num_free_blocks == 40
        assert len(sched.running) + cache.num_free_slots == 6
        assert all(s.state_slot is None for s in sched.waiting)
    for s in list(sched.running) + list(sched.waiting):
        sched.abort(s)
    assert cache.num_free_blocks == 40 and cache.num_free_slots == 6


def test_a_decode_step_stays_one_after_its_sequences_finish():
    """is_decode is fixed when the step is scheduled: a sequence finishing (its cache freed, its computed
    count back to 0) must not turn the step it finished in into a "mixed" one (metrics, graphs)."""
    sched, _ = _make()
    a = _seq(5, "a", max_tokens=2)
    sched.add(a)
    prefill = _run_step(sched)
    assert not prefill.is_decode
    decode = _run_step(sched)
    assert decode.is_decode and decode.scheduled[0].start == 5
    sched.finish(a, SequenceStatus.FINISHED_LENGTH)
    assert a.num_computed_tokens == 0
    assert decode.is_decode and not prefill.is_decode
