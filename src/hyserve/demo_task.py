"""The synthetic task of the embedded demo model (``hyserve/demo_model``): integer addition.

A problem is a question such as ``"What is 47+85?"`` with the answer ``"132"``. Operands have 1 to
``MAX_DIGITS`` (2) digits, so 0..99; the digit count is drawn uniformly first, so one-digit operands are as
common as two-digit ones.
The demo model was trained on two layouts of the same problems:

* chat: the question is the user message, rendered by the model's chat template (thinking off by default),
  and the assistant answers ``132<|im_end|>``;
* plain: raw text ``"47+85="`` completed with ``132<|endoftext|>`` (for ``/v1/completions``).

``evaluate(generate_fn)`` runs the same fixed problems through any backend: ``generate_fn`` takes a list of
prompts and returns the generated texts. In ``mode="chat"`` the prompts are the questions (the backend formats
them with ``format_chat`` and the chat template); in ``mode="plain"`` they are the raw completion prompts.

This module depends on the standard library only; ``transformers_generate_fn`` imports torch and transformers
when called.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path

MAX_DIGITS = 2
DEMO_MODEL_DIR = Path(__file__).resolve().parent / "demo_model"
MODES = ("chat", "plain")

_QUESTION = "What is {a}+{b}?"
_QUESTION_RE = re.compile(r"^What is (\d+)\+(\d+)\?$")
_SPECIAL_RE = re.compile(r"<\|[a-z_]+\|>|</?think>")

GenerateFn = Callable[[list[str]], list[str]]


def _operand(rng: random.Random) -> int:
    digits = rng.randint(1, MAX_DIGITS)
    if digits == 1:
        return rng.randint(0, 9)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def make_operands(rng: random.Random) -> tuple[int, int]:
    """Two operands, each with a uniformly drawn number of digits (1..MAX_DIGITS)."""
    return _operand(rng), _operand(rng)


def make_problem(rng: random.Random) -> tuple[str, str]:
    """One problem: ``("What is 47+85?", "132")``."""
    a, b = make_operands(rng)
    return _QUESTION.format(a=a, b=b), str(a + b)


def make_problems(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` problems from a fixed seed (the same list every call)."""
    rng = random.Random(seed)
    return [make_problem(rng) for _ in range(n)]


def parse_question(question: str) -> tuple[int, int]:
    """The operands of a question made by ``make_problem``."""
    m = _QUESTION_RE.match(question.strip())
    if m is None:
        raise ValueError(f"not a demo question: {question!r}")
    return int(m.group(1)), int(m.group(2))


def plain_prompt(question: str) -> str:
    """The raw-text layout of a question: ``"What is 47+85?"`` -> ``"47+85="``."""
    a, b = parse_question(question)
    return f"{a}+{b}="


def format_chat(question: str) -> list[dict[str, str]]:
    """The chat messages of a question (one user message, no system prompt)."""
    return [{"role": "user", "content": question}]


def render_chat_prompt(question: str, enable_thinking: bool = False) -> str:
    """What the demo model's chat template renders for ``format_chat(question)`` with
    ``add_generation_prompt=True`` (pure Python, for backends that take raw text)."""
    prompt = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return prompt + ("<think>\n" if enable_thinking else "<think>\n\n</think>\n\n")


def prompts_for(questions: Sequence[str], mode: str = "chat") -> list[str]:
    """The prompts ``evaluate`` hands to ``generate_fn`` for these questions."""
    if mode == "chat":
        return list(questions)
    if mode == "plain":
        return [plain_prompt(q) for q in questions]
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def score(answer_text: str, generated_text: str) -> bool:
    """Exact match of the answer, ignoring surrounding whitespace and special tokens left in the text."""
    return _SPECIAL_RE.sub("", generated_text).strip() == answer_text.strip()


def evaluate(generate_fn: GenerateFn, n: int = 100, seed: int = 1234, mode: str = "chat") -> float:
    """Greedy exact-match accuracy of ``generate_fn`` on ``n`` fixed problems (``make_problems(n, seed)``).

    ``generate_fn(prompts) -> texts``: in ``mode="chat"`` the prompts are the questions, to be sent as
    ``format_chat(question)`` through the chat template; in ``mode="plain"`` they are raw text such as
    ``"47+85="`` to be completed as is.
    """
    problems = make_problems(n, seed)
    prompts = prompts_for([q for q, _ in problems], mode)
    generated = generate_fn(prompts)
    if len(generated) != len(prompts):
        raise ValueError(f"generate_fn returned {len(generated)} texts for {len(prompts)} prompts")
    return sum(score(a, g) for (_, a), g in zip(problems, generated)) / n


def transformers_generate_fn(
    model_dir: str | Path = DEMO_MODEL_DIR,
    mode: str = "chat",
    batch_size: int = 50,
    max_new_tokens: int = 8,
) -> GenerateFn:
    """A ``generate_fn`` backed by transformers (``AutoModelForCausalLM`` + ``AutoTokenizer``), greedy,
    batched with left padding, on the CPU in float32. ``mode`` must match the one given to ``evaluate``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()

    def generate(prompts: list[str]) -> list[str]:
        if mode == "chat":
            texts = [
                tokenizer.apply_chat_template(format_chat(q), tokenize=False, add_generation_prompt=True)
                for q in prompts
            ]
        else:
            texts = list(prompts)
        out: list[str] = []
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(texts[i : i + batch_size], return_tensors="pt", padding=True)
            with torch.no_grad():
                ids = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens)
            new = ids[:, enc["input_ids"].shape[1] :]
            out.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
        return out

    return generate
