"""The embedded demo model (``hyserve/demo_model``, made by ``scripts/train_demo.py``) and its task."""

from __future__ import annotations

import json
import random

import pytest

from hyserve import demo_task
from hyserve.demo_task import DEMO_MODEL_DIR

MAX_BYTES = 10 * 1024 * 1024
# Measured through transformers (greedy, batched, left padding) when the model was shipped: chat 99/100 and
# plain 99/100 on evaluate(n=100, seed=1234). The margin leaves room for other torch builds' rounding.
MIN_CHAT_ACCURACY = 0.95
MIN_PLAIN_ACCURACY = 0.93

STRINGS = [
    "What is 47+85?",
    "47+85=132<|endoftext|>",
    "Hello, world! It's 2026; they'll see.",
    "  leading spaces\n\n\ttabs\r\nand  double  spaces  ",
    "héllo wörld Café ñ 😀 日本語 ١٢٣",
    "e\u0301 (decomposed é, NFC-normalized)",
    "<think>\nreasoning\n</think>\n\nanswer<|im_end|>",
    "<tool_call>\n<function=add>\n</function>\n</tool_call>",
    "12345678901234567890",
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_DIR))


@pytest.fixture(scope="module")
def raw_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))


def test_folder_layout_and_size():
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
        "README.md",
    ):
        assert (DEMO_MODEL_DIR / name).is_file(), name
    assert (DEMO_MODEL_DIR / "model.safetensors").stat().st_size <= MAX_BYTES
    config = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_moe_text"
    assert config["architectures"] == ["Qwen3_5MoeForCausalLM"]
    assert config["layer_types"].count("full_attention") >= 1
    assert config["layer_types"].count("linear_attention") >= 1
    assert config["tie_word_embeddings"] is False
    tok_config = json.loads((DEMO_MODEL_DIR / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == (DEMO_MODEL_DIR / "chat_template.jinja").read_text()
    assert tok_config["eos_token"] == "<|im_end|>"
    assert tok_config["pad_token"] == "<|endoftext|>"
    assert tok_config["bos_token"] is None


def test_loads_with_transformers(tokenizer):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(str(DEMO_MODEL_DIR))
    assert type(config).__name__ == "Qwen3_5MoeTextConfig"
    assert config.vocab_size >= len(tokenizer)
    assert type(tokenizer).__name__ == "Qwen3_5Tokenizer"
    model = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_DIR))
    assert type(model).__name__ == "Qwen3_5MoeForCausalLM"
    assert model.dtype == torch.float32

    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    generation = GenerationConfig.from_pretrained(str(DEMO_MODEL_DIR))
    assert list(generation.eos_token_id) == [im_end, eot]
    assert generation.pad_token_id == eot
    assert not generation.do_sample
    assert tokenizer.eos_token_id == im_end
    assert tokenizer.pad_token_id == eot
    assert tokenizer.bos_token is None


def test_special_tokens(tokenizer, raw_tokenizer):
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    names += ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
    ids = [raw_tokenizer.token_to_id(name) for name in names]
    assert ids == list(range(ids[0], ids[0] + len(names)))  # after the regular vocabulary
    assert ids[-1] == raw_tokenizer.get_vocab_size() - 1
    for name, i in zip(names, ids):
        assert tokenizer(name)["input_ids"] == [i]
    # no BOS is prepended
    assert tokenizer("1+2=")["input_ids"] == raw_tokenizer.encode("1+2=").ids
    # digits are split one by one
    assert len(tokenizer("12345")["input_ids"]) == 5


def test_transformers_and_tokenizers_agree(tokenizer, raw_tokenizer):
    chats = [
        demo_task.format_chat("What is 47+85?"),
        [
            {"role": "system", "content": "You are a calculator."},
            {"role": "user", "content": "What is 1+2?"},
            {"role": "assistant", "content": "3"},
            {"role": "user", "content": "Und 3+4? Ça va?"},
        ],
    ]
    texts = list(STRINGS)
    for chat in chats:
        texts.append(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert ids == raw_tokenizer.encode(text).ids, text
        assert tokenizer.decode(ids) == raw_tokenizer.decode(ids, skip_special_tokens=False)
    batch = tokenizer(texts)["input_ids"]
    assert batch == [e.ids for e in raw_tokenizer.encode_batch(texts)]
    templated = tokenizer.apply_chat_template(chats[0], tokenize=True, add_generation_prompt=True)
    templated = templated["input_ids"] if not isinstance(templated, list) else templated
    assert templated == raw_tokenizer.encode(demo_task.render_chat_prompt("What is 47+85?")).ids


def test_chat_template_layout(tokenizer):
    def render(messages, **kwargs):
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)

    user = [{"role": "user", "content": "What is 47+85?"}]
    assert render(user, add_generation_prompt=True) == (
        "<|im_start|>user\nWhat is 47+85?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert render(user, add_generation_prompt=True) == demo_task.render_chat_prompt("What is 47+85?")
    assert render(user, add_generation_prompt=True, enable_thinking=True) == (
        "<|im_start|>user\nWhat is 47+85?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert render(user, add_generation_prompt=True, enable_thinking=True) == demo_task.render_chat_prompt(
        "What is 47+85?", enable_thinking=True
    )
    assert render(user) == "<|im_start|>user\nWhat is 47+85?<|im_end|>\n"
    # a rendered conversation extends the generation prompt by the answer: what the model was trained on
    answered = user + [{"role": "assistant", "content": "132"}]
    assert render(answered) == render(user, add_generation_prompt=True) + "132<|im_end|>\n"
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
            ],
        },
        {"role": "tool", "content": "rain"},
        {"role": "tool", "content": "5 C"},
    ]
    assert render(conversation, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nGreet back.\n</think>\n\nHello.<|im_end|>\n"
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "<tool_call>\n<function=weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nrain\n</tool_response>\n<tool_response>\n5 C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    with_tools = render(user, tools=tools, add_generation_prompt=True)
    assert with_tools.startswith("<|im_start|>system\n# Tools\n")
    assert '"name": "weather"' in with_tools
    assert with_tools.endswith(render(user, add_generation_prompt=True))


def test_task_helpers():
    problems = demo_task.make_problems(200, seed=7)
    assert problems == demo_task.make_problems(200, seed=7)
    for question, answer in problems:
        a, b = demo_task.parse_question(question)
        assert 0 <= a < 10**demo_task.MAX_DIGITS and 0 <= b < 10**demo_task.MAX_DIGITS
        assert int(answer) == a + b
        assert demo_task.plain_prompt(question) == f"{a}+{b}="
    assert demo_task.make_problem(random.Random(0)) == demo_task.make_problems(1, seed=0)[0]
    assert demo_task.format_chat("What is 1+2?") == [{"role": "user", "content": "What is 1+2?"}]
    assert demo_task.score("132", " 132")
    assert demo_task.score("132", "132<|im_end|>")
    assert not demo_task.score("132", "1320")
    assert not demo_task.score("132", "")
    assert demo_task.evaluate(lambda qs: [str(sum(demo_task.parse_question(q))) for q in qs], n=20) == 1.0
    assert demo_task.evaluate(lambda ps: ["0"] * len(ps), n=20, mode="plain") < 0.5
    with pytest.raises(ValueError):
        demo_task.evaluate(lambda ps: ps, mode="nope")


def test_accuracy_through_transformers():
    chat = demo_task.evaluate(demo_task.transformers_generate_fn(), n=100, seed=1234)
    assert chat >= MIN_CHAT_ACCURACY, chat
    plain = demo_task.evaluate(
        demo_task.transformers_generate_fn(mode="plain"), n=100, seed=1234, mode="plain"
    )
    assert plain >= MIN_PLAIN_ACCURACY, plain


def test_max_model_len_beyond_the_model_is_refused():
    from hyserve.llm import LLM

    with pytest.raises(ValueError, match="max_position_embeddings 512"):
        LLM(str(DEMO_MODEL_DIR), device="cpu", progress=False, max_model_len=513)
