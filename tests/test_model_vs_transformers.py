"""hyserve against transformers' own implementation, fp32 on the CPU, on tiny random checkpoints."""

from __future__ import annotations

import pytest
import torch

from checkpoints import load_reference, make_checkpoint
from hyserve import LLM, SamplingParams
from hyserve.engine.scheduler import ScheduledSequence, SchedulerOutput
from hyserve.engine.sequence import Sequence
from hyserve.kernels.testing import rel_err

VARIANTS = {
    "moe-flat": dict(kind="moe"),
    "moe-multimodal-fused": dict(kind="moe", multimodal=True, expert_layout="fused"),
    "moe-per-expert": dict(kind="moe", expert_layout="per_expert"),
    "dense-flat": dict(kind="dense"),
    "dense-multimodal": dict(kind="dense", multimodal=True),
    "moe-mixed-layers": dict(
        kind="moe",
        num_hidden_layers=6,
        layer_types=["full_attention", "linear_attention", "linear_attention"] * 2,
    ),
}
REL_TOL = 1e-4


@pytest.fixture(scope="module", params=list(VARIANTS))
def checkpoint(request, tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp(request.param), seed=7, **VARIANTS[request.param])
    return path, load_reference(path)


def _engine(path, **kw) -> LLM:
    return LLM(str(path), device="cpu", dtype="float32", progress=False, max_model_len=512, **kw)


def _score(llm: LLM, prompt: list[int], chunks: list[int]) -> torch.Tensor:
    """Teacher-forced logits of ``prompt`` computed in consecutive chunks of the given sizes."""
    engine = llm.engine
    seq = Sequence("score", prompt, SamplingParams())
    pieces = []
    for n in chunks:
        engine.cache_manager.allocate(seq, seq.num_computed_tokens + n)
        out = SchedulerOutput([ScheduledSequence(seq, n, sample=False)])
        pieces.append(engine.runner.score(out)[0])
        seq.num_computed_tokens += n
    engine.cache_manager.free(seq)
    return torch.cat(pieces)


def test_prefill_logits_match(checkpoint):
    path, ref = checkpoint
    llm = _engine(path)
    gen = torch.Generator().manual_seed(0)
    for length in (1, 7, 70, 150):
        ids = torch.randint(0, ref.config.get_text_config().vocab_size, (length,), generator=gen).tolist()
        expected = ref(torch.tensor([ids])).logits[0]
        assert rel_err(_score(llm, ids, [length]), expected) < REL_TOL


def test_chunked_prefill_and_decode_steps_match(checkpoint):
    """A prefill in chunks, then one token at a time (the decode kernels), against one full forward."""
    path, ref = checkpoint
    llm = _engine(path)
    ids = torch.randint(0, 500, (90,), generator=torch.Generator().manual_seed(1)).tolist()
    expected = ref(torch.tensor([ids])).logits[0]
    got = _score(llm, ids, [33, 40] + [1] * 17)
    assert rel_err(got, expected) < REL_TOL
    for pos in range(73, 90):
        assert rel_err(got[pos], expected[pos]) < REL_TOL, pos


def test_fresh_prompts_attend_over_their_own_rows(checkpoint, monkeypatch):
    """A lone prompt's first chunk takes ``causal_attention`` (no cache reads); a later chunk and a batch of
    prompts take ``paged_attention``, decode steps ``decode_attention`` (both read the cache: "paged" here); the
    logits match transformers either way."""
    import hyserve.kernels as ops

    calls = {"causal": 0, "paged": 0}
    pairs = (("causal_attention", "causal"), ("paged_attention", "paged"), ("decode_attention", "paged"))
    for name, key in pairs:
        real = getattr(ops, name)
        monkeypatch.setattr(
            ops, name, lambda *a, _r=real, _k=key, **kw: calls.__setitem__(_k, calls[_k] + 1) or _r(*a, **kw)
        )
    path, ref = checkpoint
    llm = _engine(path)
    layers = sum(hasattr(layer, "self_attn") for layer in llm.engine.model.model.layers)
    ids = torch.randint(0, 500, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    got = _score(llm, ids, [30, 8, 1, 1])
    assert calls == {"causal": layers, "paged": 3 * layers}
    assert rel_err(got, ref(torch.tensor([ids])).logits[0]) < REL_TOL
    last_rows_forward(llm, [ids[:9], ids[:5]], [True, True])
    assert calls == {"causal": layers, "paged": 4 * layers}
    # a lone prompt that samples its last row: a last attention layer's one query reads the cache instead
    last = int(hasattr(llm.engine.model.model.layers[-1], "self_attn"))
    got = last_rows_forward(llm, [ids[:9]], [True])
    assert calls == {"causal": 2 * layers - last, "paged": 4 * layers + last}
    assert rel_err(got[0], ref(torch.tensor([ids[:9]])).logits[0, -1]) < REL_TOL


def last_rows_forward(llm: LLM, prompts: list[list[int]], sampled: list[bool]) -> torch.Tensor:
    """One step that prefills every prompt whole, sampling those marked: the model's logits [L, V] (L = the
    sampled prompts' last rows; the last layer's FFN runs at those rows only)."""
    engine = llm.engine
    seqs = [Sequence(f"s{i}", p, SamplingParams()) for i, p in enumerate(prompts)]
    for seq, p in zip(seqs, prompts, strict=True):
        engine.cache_manager.allocate(seq, len(p))
    out = SchedulerOutput([ScheduledSequence(s, len(p), sample=w) for s, p, w in zip(seqs, prompts, sampled)])
    batch = engine.runner.prepare(out)
    with torch.inference_mode():
        logits = engine.runner.model.compute_logits(engine.runner.model(batch, engine.runner.cache))
    for seq in seqs:
        engine.cache_manager.free(seq)
    return logits


def test_last_layer_ffn_at_the_sampled_rows_only(checkpoint):
    """A prefill step returns the rows that need logits only (the last layer's FFN skips the others): the
    sampled prompts' last rows match transformers there, and a step that samples nothing returns no row."""
    path, ref = checkpoint
    llm = _engine(path)
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in (5, 30, 12)]
    sampled = [True, False, True]
    got = last_rows_forward(llm, prompts, sampled)
    wanted = [p for p, s in zip(prompts, sampled) if s]
    assert got.shape[0] == len(wanted)
    for row, p in zip(got, wanted):
        assert rel_err(row, ref(torch.tensor([p])).logits[0, -1]) < REL_TOL
    assert last_rows_forward(llm, prompts[1:2], [False]).shape[0] == 0


def test_greedy_generation_matches_transformers(checkpoint):
    path, ref = checkpoint
    llm = _engine(path)
    prompt = torch.randint(0, 500, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    expected = ref.generate(
        torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(prompt) :].tolist()
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))[0]
    assert out.outputs[0].token_ids == expected


def test_batch_equals_each_prompt_alone(checkpoint):
    path, _ = checkpoint
    llm = _engine(path, max_num_batched_tokens=64)  # forces chunked prefill mixed with decodes
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in (3, 17, 40, 100, 1)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    alone = [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    assert batched == alone
