"""The sampler against direct formulas: filters, penalties, seeds, logprobs."""

from __future__ import annotations

import torch

from hyserve.engine.sampler import sample
from hyserve.engine.sampling_params import SamplingParams
from hyserve.engine.sequence import Sequence


def _seq(params: SamplingParams, outputs=(), prompt=(1, 2, 3), index=0) -> Sequence:
    s = Sequence("r", list(prompt), params, index=index)
    s.output_token_ids = list(outputs)
    return s


def _empirical(logits: torch.Tensor, params: SamplingParams, n: int = 4000) -> torch.Tensor:
    seqs = [_seq(params) for _ in range(n)]
    tokens = sample(logits.expand(n, -1).clone(), seqs, (), None).token_ids
    return torch.bincount(torch.tensor(tokens), minlength=logits.shape[-1]).float() / n


def test_greedy_is_argmax_after_penalties():
    logits = torch.tensor([[1.0, 3.0, 2.9, -1.0]])
    assert sample(logits, [_seq(SamplingParams(temperature=0.0))], (), None).token_ids == [1]
    # token 1 was generated before: a frequency penalty of 0.5 makes token 2 win
    seq = _seq(SamplingParams(temperature=0.0, frequency_penalty=0.5), outputs=[1])
    assert sample(logits, [seq], (), None).token_ids == [2]
    # repetition penalty divides positive logits of seen tokens (prompt included)
    seq = _seq(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt=[1])
    assert sample(logits, [seq], (), None).token_ids == [2]


def test_temperature_and_filters_match_the_formula():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    cases = [
        (SamplingParams(temperature=0.7), None),
        (SamplingParams(temperature=1.0, top_k=2), [0, 1]),
        (SamplingParams(temperature=1.0, top_p=0.8), None),
        (SamplingParams(temperature=1.0, min_p=0.3), None),
    ]
    for params, keep in cases:
        p = (logits[0] / params.temperature).softmax(-1)
        if keep is not None:
            mask = torch.zeros_like(p, dtype=torch.bool)
            mask[keep] = True
        elif params.top_p < 1:
            order = p.argsort(descending=True)
            before = p[order].cumsum(0) - p[order]
            mask = torch.zeros_like(p, dtype=torch.bool)
            mask[order[before < params.top_p]] = True
        elif params.min_p > 0:
            mask = p >= params.min_p * p.max()
        else:
            mask = torch.ones_like(p, dtype=torch.bool)
        expected = torch.where(mask, p, 0)
        expected /= expected.sum()
        got = _empirical(logits, params)
        assert (got - expected).abs().max() < 0.03, (params, got, expected)


def test_seeded_sampling_ignores_the_rest_of_the_batch():
    torch.manual_seed(1)
    logits = torch.randn(1, 50)
    params = SamplingParams(temperature=1.0, seed=1234)
    alone = [
        sample(logits.clone(), [_seq(params, outputs=[0] * i)], (), None).token_ids[0] for i in range(20)
    ]
    crowd = []
    for i in range(20):
        others = [_seq(SamplingParams(temperature=1.0)) for _ in range(5)]
        seqs = [*others[:2], _seq(params, outputs=[0] * i), *others[2:]]
        crowd.append(sample(logits.expand(6, -1).clone(), seqs, (), None).token_ids[2])
    assert alone == crowd
    assert len(set(alone)) > 3, "a seed must still sample, not repeat one token"


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.tensor([[0.0, 1.0, 9.0, 8.0]])
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[3])
    assert sample(logits, [_seq(params, outputs=[0])], (2,), None).token_ids == [1]
    assert sample(logits, [_seq(params, outputs=[0, 0])], (2,), None).token_ids == [2]


def test_logprobs_are_raw_model_logprobs():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    out = sample(logits, [_seq(SamplingParams(temperature=0.0, logprobs=2))], (), 2)
    ref = logits.log_softmax(-1)[0]
    assert abs(out.logprobs[0] - ref[2].item()) < 1e-6
    assert [t for t, _ in out.top_logprobs[0]] == [2, 1]
    assert abs(out.top_logprobs[0][1][1] - ref[1].item()) < 1e-6


def test_bad_sampling_values_raise_clear_errors():
    import pytest

    for kwargs, word in [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"n": 0}, "n must"),
        ({"max_tokens": 2, "min_tokens": 3}, "min_tokens"),
        ({"logprobs": 50}, "logprobs"),
    ]:
        with pytest.raises(ValueError, match=word):
            SamplingParams(**kwargs)
