"""A request's result does not depend on what ran before it: the same prompt after others, whose DeltaNet state
slot and KV blocks it then reuses, gives the same tokens and logprobs bit for bit (fp32, CPU), on the reference
path and through the Triton kernels (interpreter). A state or cache row left stale by an earlier sequence would
show here first."""

from __future__ import annotations

import importlib

import pytest
import torch

from checkpoints import make_checkpoint
from hyserve.engine.llm_engine import EngineArgs, LLMEngine
from hyserve.engine.sampling_params import SamplingParams
from hyserve.kernels.moe.test_moe import pairs_plan, small_plan


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(
        tmp_path_factory.mktemp("slot-reuse"),
        kind="moe",
        seed=5,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention"] * 2,
        shared_expert_intermediate_size=32,
    )


def _run(
    engine: LLMEngine, request_id: str, prompt: list[int], max_tokens: int
) -> tuple[list[int], list[float]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    engine.add_request(request_id, prompt, params)
    last = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == request_id:
                last = out
    c = last.outputs[0]
    return c.token_ids, [lp[0] for lp in c.logprobs]


def _check(checkpoint, max_tokens: int) -> None:
    # two sequence slots: the later requests take the slots (and the blocks) the earlier ones freed
    args = EngineArgs(
        model=str(checkpoint),
        device="cpu",
        dtype="float32",
        max_num_seqs=2,
        max_model_len=128,
        progress=False,
    )
    engine = LLMEngine(args)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 500, (24,), generator=gen).tolist()
    other = torch.randint(0, 500, (40,), generator=gen).tolist()
    first = _run(engine, "first", prompt, max_tokens)
    _run(engine, "other-1", other, max_tokens)
    _run(engine, "other-2", other, max_tokens)
    assert _run(engine, "again", prompt, max_tokens) == first


def test_reference_path(checkpoint):
    _check(checkpoint, max_tokens=8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter's test")
def test_triton_kernels(checkpoint, monkeypatch):
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # plans for the tiny shapes, as tests/test_model_triton_interpreter.py: the GEMV for the projections, the
    # pairs MoE with the fused router for single tokens
    linear_op = importlib.import_module("hyserve.kernels.linear")
    triton_moe = importlib.import_module("hyserve.kernels.moe.triton_moe")
    monkeypatch.setattr(linear_op, "gemv_plan", lambda n, k: {"BLOCK_N": 8, "BLOCK_K": 32})
    monkeypatch.setattr(
        triton_moe,
        "get_plan",
        lambda T, E, H, inter, top_k, dtype: (
            pairs_plan(True, H, inter) if T <= 4 else small_plan(16, "scatter", E, H, inter)
        ),
    )
    _check(checkpoint, max_tokens=3)
