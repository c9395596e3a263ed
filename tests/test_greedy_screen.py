"""The greedy screen of the LM head (layers/lm_head.py, kernels/greedy_head) in the engine: a step of plain
greedy requests takes the greedy-only graph and gives the tokens of the full head; a step with logprobs,
sampling or penalties takes the full graph. The CPU cannot capture graphs, so a stand-in replays the same
step eagerly (the screen runs through its torch reference here, its Triton kernels in the kernel tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoints import make_checkpoint
from hyserve import LLM, SamplingParams
from hyserve.kernels.argmax import logits_argmax
from hyserve.layers import LMHead


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("greedy-screen"), seed=31)


class _EagerGraphs:
    """Stands in for ``DecodeGraphs`` on the CPU: the same decode step, run eagerly; records ``greedy_only``."""

    def __init__(self, runner) -> None:
        self.runner, self.calls = runner, []

    def can_run(self, out) -> bool:
        return out.is_decode

    def run(self, out, input_tokens=None, greedy_only=False):
        self.calls.append(greedy_only)
        batch = self.runner.prepare(out)
        if input_tokens is not None:
            batch.input_ids = input_tokens
        hidden = self.runner.model(batch, self.runner.cache)
        if greedy_only:
            return None, self.runner.model.compute_greedy(hidden)
        return self.runner.model.compute_logits_and_greedy(hidden)


def test_lm_head_greedy_matches_the_logits_argmax():
    torch.manual_seed(0)
    head = LMHead(64, 3000)
    head.weight.data = torch.randn(3000, 64) / 8
    hidden = torch.randn(9, 64)
    want = logits_argmax(head(hidden))[1]
    assert not head.screens and head.greedy(hidden).tolist() == want.tolist()
    assert head.prepare_greedy_screen() == 3000 * 64 + 3 * 3000 * 4
    assert head.screens
    assert head.greedy(hidden[:4]).tolist() == want[:4].tolist()  # screened
    assert head.greedy(hidden).tolist() == want.tolist()  # 9 rows: more than the screen takes, the full head


def test_plain_greedy_steps_take_the_greedy_only_graph(model_dir):
    prompts = [[5, 9, 13, 200], [7, 7, 7], [300, 2, 18, 44, 61]]
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    want = [
        o.outputs[0].token_ids
        for o in LLM(str(model_dir), device="cpu", progress=False).generate(prompts, greedy)
    ]
    llm = LLM(str(model_dir), device="cpu", progress=False)
    llm.engine.model.lm_head.prepare_greedy_screen()
    graphs = llm.engine.runner.graphs = _EagerGraphs(llm.engine.runner)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
    assert got == want
    assert graphs.calls and all(graphs.calls)
    graphs.calls.clear()
    for params in (
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.7, seed=3, max_tokens=4, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, repetition_penalty=1.2),
    ):
        llm.generate(prompts[:1], params)
        assert graphs.calls and not any(graphs.calls)
        graphs.calls.clear()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and the Triton screen need a GPU")
@pytest.mark.parametrize("prefill_sizes", [[], [8]])
def test_captured_greedy_graphs_give_the_full_heads_tokens(model_dir, prefill_sizes):
    """With prefill graphs ([8]: a lone prompt of 3-5 tokens replays the padded 8-token graph) a plain greedy
    prompt's first token comes from the screen too (the runner's head after the replay)."""
    prompts = [[5, 9, 13, 200], [7, 7, 7], [300, 2, 18, 44, 61]]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = {}
    for screen in (False, True):
        llm = LLM(str(model_dir), device="cuda", progress=False, greedy_screen=screen, max_num_seqs=4,
                  kv_cache_memory_gb=1, cuda_graph_sizes=[1, 2, 4], prefill_graph_sizes=prefill_sizes,
                  warmup=False)  # fmt: skip
        assert sorted(llm.engine.runner.graphs.greedy_graphs) == ([1, 2, 4] if screen else [])
        outs[screen] = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
        outs[screen] += [llm.generate(p, greedy)[0].outputs[0].token_ids for p in prompts]  # alone: batch 1
        del llm
    assert outs[True] == outs[False]


def test_screen_rows_script_on_the_trained_demo_model():
    """``scripts/screen_rows.py``: the trained demo head leaves about one row per token to compute exactly."""
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, str(root / "scripts" / "screen_rows.py"), "--model", str(root / "src/hyserve/demo_model"),
         "--device", "cpu", "--prompts", "8", "--max-tokens", "3"],
        env=dict(os.environ, PYTHONPATH=str(root / "src")), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("rows computed exactly"))
    assert float(line.split("max ")[1]) <= 4  # of 320 rows
