"""The embedded demo model through hyserve: the same answers, hence the same accuracy, as transformers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hyserve import LLM, SamplingParams
from hyserve.demo_task import DEMO_MODEL_DIR, evaluate, format_chat, transformers_generate_fn

N = 100


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(str(DEMO_MODEL_DIR), device="cpu", progress=False, max_model_len=128)


def _hyserve_fn(llm: LLM, mode: str):
    params = SamplingParams(temperature=0.0, max_tokens=8)

    def generate(prompts: list[str]) -> list[str]:
        if mode == "chat":
            outs = llm.chat([format_chat(q) for q in prompts], params)
        else:
            outs = llm.generate(prompts, params)
        return [o.outputs[0].text for o in outs]

    return generate


@pytest.mark.parametrize("mode", ["chat", "plain"])
def test_demo_accuracy_equals_transformers(llm, mode):
    seen: dict[str, list[str]] = {}

    def recording(name, fn):
        def wrapped(prompts):
            seen[name] = fn(prompts)
            return seen[name]

        return wrapped

    ours = evaluate(recording("hyserve", _hyserve_fn(llm, mode)), n=N, mode=mode)
    theirs = evaluate(recording("transformers", transformers_generate_fn(mode=mode)), n=N, mode=mode)
    assert ours == theirs
    assert ours >= 0.93
    strip = [s.split("<|")[0].strip() for s in seen["transformers"]]
    assert [s.strip() for s in seen["hyserve"]] == strip


def test_hyserve_generate_command_answers():
    out = subprocess.run(
        [sys.executable, "-m", "hyserve", "--log-level", "WARNING", "generate", "--device", "cpu"]
        + ["--prompt", "What is 47+85?", "--prompt", "What is 3+9?", "--max-tokens", "8"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "-> '132'" in out.stdout and "-> '12'" in out.stdout
