"""Start-up warm-up: the lengths cover every token bucket, and a warm-up leaves the engine idle and its
cache free (run here on the CPU with the demo model; the engine calls it itself only on CUDA)."""

from __future__ import annotations

from hyserve.engine.args import DEMO_MODEL
from hyserve.engine.warmup import warm_up, warmup_lengths
from hyserve.llm import LLM


def test_lengths_cover_each_bucket_both_ways():
    lengths = warmup_lengths(1000)
    assert lengths[-1] == 1000 and max(lengths) <= 1000
    for bucket in (16, 32, 64, 128, 256, 512):
        inside = [n for n in lengths if bucket // 2 < n <= bucket]
        assert any(n % 16 == 0 for n in inside) and any(n % 16 for n in inside), bucket


def test_warm_up_leaves_the_engine_idle():
    llm = LLM(str(DEMO_MODEL), device="cpu", max_num_batched_tokens=64, max_num_seqs=4)
    engine = llm.engine
    free_blocks, free_slots = engine.cache_manager.num_free_blocks, engine.cache_manager.num_free_slots
    warm_up(engine)
    assert not engine.has_unfinished_requests() and not engine.requests
    assert engine.cache_manager.num_free_blocks == free_blocks
    assert engine.cache_manager.num_free_slots == free_slots
    assert llm.generate([[5, 6, 7]])[0].outputs[0].token_ids  # still serves


def test_warm_up_runs_a_multi_sequence_prefill_and_a_mixed_step():
    llm = LLM(str(DEMO_MODEL), device="cpu", max_num_batched_tokens=512, max_num_seqs=4)
    engine = llm.engine
    steps, step = [], engine.step

    def recording_step():
        outputs = step()
        if engine.last_step is not None:
            steps.append([e.num_new_tokens for e in engine.last_step.scheduled])
        return outputs

    engine.step = recording_step
    warm_up(engine)
    assert any(len(s) >= 2 and all(n > 1 for n in s) for s in steps), "no multi-prompt prefill"
    assert any(1 in s and max(s) > 1 for s in steps), "no mixed step (decode rows + a prefill chunk)"


def test_warm_up_prefills_eagerly_then_replays_each_prefill_graph(monkeypatch):
    """The eager prefill meets every bucket although lone prompts will take the prefill graphs; then each
    graph size runs once (an uncaptured PrefillGraphs runs its padded forward eagerly on the CPU)."""
    from hyserve.engine.prefill_graphs import PrefillGraphs

    llm = LLM(str(DEMO_MODEL), device="cpu", max_num_batched_tokens=64, max_num_seqs=4)
    engine = llm.engine
    runner = engine.runner
    graphs = runner.graph_set(PrefillGraphs, [16, 48], engine.max_model_len)
    runner.prefill_graphs = graphs
    replayed = []
    run = graphs.run
    monkeypatch.setattr(
        graphs, "run", lambda out: replayed.append(out.scheduled[0].num_new_tokens) or run(out)
    )
    warm_up(engine)
    assert replayed == [16, 48]
    assert runner.prefill_graphs is graphs
