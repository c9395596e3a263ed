"""A request's result does not depend on what ran before it: the same prompt after others, whose DeltaNet state
slot and KV blocks it then reuses, gives the same tokens and logprobs bit for bit (fp32, CPU), on the reference
path and through the Triton kernels (interpreter). A state or cache row left stale by an earlier sequence would
show here first."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hyserve import LLM
from hyserve.engine.sampling_params import SamplingParams

# the interpreter model test's tiny MoE checkpoint and its Triton plans for the tiny shapes
from test_model_triton_interpreter import checkpoint, triton_kernels  # noqa: F401


def _check(path: Path, max_tokens: int) -> None:
    # two sequence slots: the later requests take the slots (and the blocks) the earlier ones freed
    llm = LLM(str(path), device="cpu", dtype="float32", max_num_seqs=2, max_model_len=128, progress=False)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)

    def run(prompt: list[int]) -> tuple[list[int], list[float]]:
        c = llm.generate(prompt, params)[0].outputs[0]
        return c.token_ids, [lp[0] for lp in c.logprobs]

    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 500, (24,), generator=gen).tolist()
    other = torch.randint(0, 500, (40,), generator=gen).tolist()
    first = run(prompt)
    run(other)
    run(other)
    assert run(prompt) == first


def test_reference_path(checkpoint):  # noqa: F811
    _check(checkpoint[0], max_tokens=8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter's test")
def test_triton_kernels(checkpoint, triton_kernels):  # noqa: F811
    _check(checkpoint[0], max_tokens=3)
    assert triton_kernels["gemv"] > 0 and triton_kernels["pairs"] > 0
