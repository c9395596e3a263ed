"""The server through the official openai client, over real HTTP, against transformers on the same
tiny checkpoint: greedy text, logprobs, echo scoring (lm-eval), streaming, seeds, n, stops, usage."""

from __future__ import annotations

import asyncio
import logging

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from checkpoints import load_reference
from hyserve.config import ModelConfig
from hyserve.engine.runner import cache_bytes
from server_harness import MODEL_NAME, BackgroundServer, text_checkpoint
from tokenizer_fixture import TOKENIZER_SIZE

PROMPTS = ["Hello, world!", "The quick brown fox", "Once upon a time there was", "1234 + 56.78 ="]
TOL = 1e-4


@pytest.fixture(autouse=True)
def no_errors_logged(caplog):
    """Whatever the clients do here, the server must not log an error (e.g. a traceback it survived)."""
    caplog.set_level(logging.WARNING)
    yield
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(text_checkpoint()) as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(text_checkpoint()))


@pytest.fixture(scope="module")
def ref():
    return load_reference(text_checkpoint())


class Reference:
    """transformers' answers on the checkpoint: greedy continuations and teacher-forced logprobs."""

    def __init__(self, model, tok, eos: list[int]) -> None:
        self.model, self.tok, self.eos = model, tok, eos

    @torch.no_grad()
    def greedy(self, ids: list[int], max_new: int, stop_at_eos: bool = True) -> list[int]:
        out = self.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=self.eos if stop_at_eos else None,
            pad_token_id=self.eos[0],
        )
        return out[0, len(ids) :].tolist()

    @torch.no_grad()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """[len(ids), V]: row p is the distribution of token p + 1."""
        return self.model(torch.tensor([ids])).logits[0].float().log_softmax(-1)

    def text(self, generated: list[int]) -> str:
        return self.tok.decode(generated, skip_special_tokens=True)


@pytest.fixture(scope="module")
def reference(server, ref, tok) -> Reference:
    return Reference(ref, tok, list(server.engine.eos_token_ids))


def _finish(generated: list[int], eos: list[int], max_new: int) -> str:
    return "stop" if generated and generated[-1] in eos and len(generated) <= max_new else "length"


def test_completion_greedy_matches_transformers(client, tok, reference):
    max_new = 24
    for prompt in PROMPTS:
        ids = tok.encode(prompt, add_special_tokens=False)
        expected = reference.greedy(ids, max_new)
        out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=max_new, temperature=0)
        choice = out.choices[0]
        assert choice.text == reference.text(expected), prompt
        assert choice.finish_reason == _finish(expected, reference.eos, max_new)
        assert out.usage.prompt_tokens == len(ids)
        assert out.usage.completion_tokens == len(expected)
        assert out.usage.total_tokens == len(ids) + len(expected)
        assert out.model == MODEL_NAME and out.object == "text_completion" and out.id.startswith("cmpl-")


def test_chat_greedy_matches_transformers(client, tok, reference):
    max_new = 20
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Say hello"}, {"type": "text", "text": "now"}]},
    ]
    flat = [messages[0], {"role": "user", "content": "Say hello\nnow"}]
    for kwargs in ({}, {"enable_thinking": False}):
        text = tok.apply_chat_template(flat, tokenize=False, add_generation_prompt=True, **kwargs)
        ids = tok.encode(text, add_special_tokens=False)
        expected = reference.greedy(ids, max_new)
        out = client.chat.completions.create(
            model=MODEL_NAME,
            messages=messages,
            max_completion_tokens=max_new,
            temperature=0,
            extra_body={"chat_template_kwargs": kwargs},
        )
        assert out.choices[0].message.role == "assistant"
        assert out.choices[0].message.content == reference.text(expected)
        assert out.choices[0].finish_reason == _finish(expected, reference.eos, max_new)
        assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), len(expected))


def test_concurrent_requests_match_each_alone(server, tok, reference):
    """24 requests of different lengths share the batch (prefills mixed with decodes); each must get
    exactly what it gets alone."""
    words = "the quick brown fox jumps over the lazy dog and sleeps in the sun".split()
    prompts = [" ".join(words[: 1 + i % len(words)]) + f" {i}" for i in range(24)]
    max_new = 10

    async def run() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
        async with aclient:
            outs = await asyncio.gather(
                *(
                    aclient.completions.create(model=MODEL_NAME, prompt=p, max_tokens=max_new, temperature=0)
                    for p in prompts
                )
            )
        return [o.choices[0].text for o in outs]

    together = asyncio.run(run())
    alone = [
        reference.text(reference.greedy(tok.encode(p, add_special_tokens=False), max_new)) for p in prompts
    ]
    assert together == alone


def _stream_completion(client, **kwargs) -> tuple[dict[int, str], dict[int, str], list]:
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    chunks = list(client.completions.create(model=MODEL_NAME, stream=True, **kwargs))
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason is not None:
                assert c.index not in finish, "a choice finished twice"
                finish[c.index] = c.finish_reason
    return texts, finish, chunks


def test_streaming_equals_non_streaming(client):
    kwargs = dict(prompt=PROMPTS[:2], max_tokens=16, temperature=1.0, seed=11, n=2)
    whole = client.completions.create(model=MODEL_NAME, **kwargs)
    texts, finish, chunks = _stream_completion(client, stream_options={"include_usage": True}, **kwargs)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert texts == {c.index: c.text for c in whole.choices}
    assert finish == {c.index: c.finish_reason for c in whole.choices}
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()

    messages = [{"role": "user", "content": "Tell me a story"}]
    chat_kwargs = dict(messages=messages, max_tokens=16, temperature=1.0, seed=5, n=2)
    whole = client.chat.completions.create(model=MODEL_NAME, **chat_kwargs)
    stream = list(
        client.chat.completions.create(
            model=MODEL_NAME, stream=True, stream_options={"include_usage": True}, **chat_kwargs
        )
    )
    first = {c.index: c.delta.role for chunk in stream[:2] for c in chunk.choices}
    assert first == {0: "assistant", 1: "assistant"}
    content: dict[int, str] = {0: "", 1: ""}
    finish = {}
    for chunk in stream[:-1]:
        assert chunk.usage is None
        for c in chunk.choices:
            content[c.index] += c.delta.content or ""
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
    assert content == {c.index: c.message.content for c in whole.choices}
    assert finish == {c.index: c.finish_reason for c in whole.choices}
    assert stream[-1].choices == [] and stream[-1].usage.model_dump() == whole.usage.model_dump()


def test_seeds_reproduce_and_n_gives_distinct_choices(client):
    def sample(seed: int, n: int = 1) -> list[str]:
        out = client.completions.create(
            model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=12, temperature=1.0, seed=seed, n=n
        )
        return [c.text for c in out.choices]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)
    three = sample(3, n=3)
    assert len(three) == 3 and len(set(three)) == 3
    assert sample(3, n=3) == three
    chat = [
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            seed=1,
            temperature=1,
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert chat[0] == chat[1]


def test_completion_logprobs_match_transformers(client, tok, reference):
    prompt = PROMPTS[2]
    ids = tok.encode(prompt, add_special_tokens=False)
    out = client.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 12
    greedy = reference.greedy(ids, 12, stop_at_eos=False)
    ref_lp = reference.logprobs(ids + greedy)
    assert lp.tokens == [tok.decode([t]) for t in greedy]
    offset = 0
    for k, token_id in enumerate(greedy):
        expected = ref_lp[len(ids) - 1 + k, token_id].item()
        assert abs(lp.token_logprobs[k] - expected) < TOL
        # tokens that decode alike share a key, so up to 3 alternatives + the chosen one; greedy: the
        # chosen token is the best
        top = lp.top_logprobs[k]
        assert 1 <= len(top) <= 4 and max(top.values()) == lp.token_logprobs[k]
        assert max(top.values()) == pytest.approx(ref_lp[len(ids) - 1 + k].max().item(), abs=TOL)
        assert lp.text_offset[k] == offset
        offset += len(lp.tokens[k])


def test_chat_logprobs_match_transformers(client, tok, reference):
    messages = [{"role": "user", "content": "Count"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False)
    out = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    greedy = reference.greedy(ids, 8)
    ref_lp = reference.logprobs(ids + greedy)
    content = out.choices[0].logprobs.content
    assert len(content) == len(greedy)
    for k, (entry, token_id) in enumerate(zip(content, greedy)):
        assert entry.token == tok.decode([token_id])
        assert entry.bytes == list(entry.token.encode())
        assert abs(entry.logprob - ref_lp[len(ids) - 1 + k, token_id].item()) < TOL
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        best = ref_lp[len(ids) - 1 + k].topk(2)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(best.values.tolist(), abs=TOL)


def test_echo_logprobs_score_token_prompts_like_lm_eval(client, reference):
    """lm-eval's local-completions: token-id prompts, echo, logprobs=1, max_tokens 1 (or 0); it reads the
    prompt's per-token logprobs from token_logprobs (the first one is null)."""
    prompts = [[5, 80, 123, 9, 44, 300, 17], [290, 3, 3, 71]]
    for max_tokens in (1, 0):
        out = client.completions.create(
            model=MODEL_NAME, prompt=prompts, max_tokens=max_tokens, temperature=0, logprobs=1, echo=True
        )
        assert len(out.choices) == 2
        for ids, choice in zip(prompts, out.choices):
            lp = choice.logprobs
            assert len(lp.token_logprobs) == len(ids) + max_tokens
            assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
            expected = reference.logprobs(ids)
            for p in range(1, len(ids)):
                assert abs(lp.token_logprobs[p] - expected[p - 1, ids[p]].item()) < TOL
                top = lp.top_logprobs[p]
                assert max(top.values()) == pytest.approx(expected[p - 1].max().item(), abs=TOL)
            assert choice.text.startswith(reference.tok.decode(ids))
        assert out.usage.prompt_tokens == sum(len(p) for p in prompts)
        assert out.usage.completion_tokens == max_tokens * len(prompts)


def test_stop_strings_cut_text_and_never_leak_into_streams(client):
    base = client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=30, temperature=0, extra_body={"ignore_eos": True}
    )
    full = base.choices[0].text
    # a 3-character stop that first occurs well inside the text, so tokens before it stream first
    at = next(i for i in range(len(full) // 3, len(full) - 3) if "\ufffd" not in full[i : i + 3])
    stop = full[at : at + 3]
    cut = full[: full.index(stop)]
    kwargs = dict(prompt=PROMPTS[1], max_tokens=30, temperature=0, stop=[stop, "never-there"])
    out = client.completions.create(model=MODEL_NAME, extra_body={"ignore_eos": True}, **kwargs)
    assert out.choices[0].text == cut
    assert out.choices[0].finish_reason == "stop" and out.choices[0].model_extra["stop_reason"] == stop
    seen = ""
    for chunk in client.completions.create(
        model=MODEL_NAME, stream=True, extra_body={"ignore_eos": True}, **kwargs
    ):
        for c in chunk.choices:
            seen += c.text
            assert cut.startswith(seen), "the stream showed text that the stop string later removed"
    assert seen == cut
    kept = client.completions.create(
        model=MODEL_NAME, extra_body={"ignore_eos": True, "include_stop_str_in_output": True}, **kwargs
    )
    assert kept.choices[0].text == cut + stop


def test_vllm_sampling_extras_are_accepted(client):
    out = client.completions.create(
        model=MODEL_NAME,
        prompt=PROMPTS[0],
        max_tokens=6,
        temperature=0.8,
        top_p=0.9,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        user="tester",
        best_of=1,
        extra_body={
            "top_k": 20,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "ignore_eos": True,
            "min_tokens": 6,
            "stop_token_ids": [2],
            "skip_special_tokens": False,
            "spaces_between_special_tokens": True,
        },
    )
    assert out.usage.completion_tokens == 6 and out.choices[0].finish_reason == "length"


def test_models_health_and_metrics(server, client):
    # one request of its own, so that the counters exist when this test runs alone
    client.completions.create(model=MODEL_NAME, prompt="metrics", max_tokens=3, temperature=0)
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert models[0].model_extra["max_model_len"] == server.engine.max_model_len
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    assert httpx.get(f"{server.url}/health").status_code == 200
    metrics = server.metrics()
    for name in (
        "hyserve:num_requests_running",
        "hyserve:num_requests_waiting",
        "hyserve:kv_cache_usage_perc",
        "hyserve:num_free_kv_blocks",
        "hyserve:num_free_state_slots",
        "hyserve:prompt_tokens_total",
        "hyserve:generation_tokens_total",
        "hyserve:request_success_total",
        "hyserve:time_to_first_token_seconds_count",
        "hyserve:time_per_output_token_seconds_count",
        "hyserve:e2e_request_latency_seconds_count",
    ):
        assert name in metrics, name
    assert metrics["hyserve:prompt_tokens_total"] > 0 and metrics["hyserve:generation_tokens_total"] > 0
    assert 0.0 <= metrics["hyserve:kv_cache_usage_perc"] <= 1.0
    # engine steps by kind: the prompts went through mixed steps, the generated tokens through decode steps
    steps = {
        (s.name, s.labels["kind"]): s.value
        for fam in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
        for s in fam.samples
        if s.name.startswith("hyserve:iteration_") and s.name.endswith(("_count", "_sum"))
    }
    for kind in ("mixed", "decode"):
        assert steps[("hyserve:iteration_seconds_count", kind)] >= 1, kind
        assert steps[("hyserve:iteration_seconds_sum", kind)] > 0.0, kind
    # a decode step computes one token per running sequence; a mixed one at least one prompt token
    for kind in ("mixed", "decode"):
        assert (
            steps[("hyserve:iteration_tokens_sum", kind)] >= steps[("hyserve:iteration_tokens_count", kind)]
        )


def test_echo_scoring_survives_preemption_and_chunked_prefill(reference):
    """A KV cache too small for the three sequences at once, and prompts prefilled in chunks: running
    sequences get preempted and recomputed from their prompts, yet each prompt token is scored exactly
    once and every number matches transformers."""
    path = text_checkpoint()
    block_bytes, _ = cache_bytes(ModelConfig.from_pretrained(path), 16, torch.float32)
    # 16 blocks of 16 tokens: room for two of the three 90-token sequences
    engine = dict(kv_cache_memory_gb=16 * block_bytes / (1 << 30), max_num_batched_tokens=64)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, TOKENIZER_SIZE, (60,), generator=gen).tolist() for _ in range(3)]
    with BackgroundServer(path, engine_kwargs=engine) as server:
        assert server.engine.cache_manager.config.num_blocks == 16
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
        out = client.completions.create(
            model=MODEL_NAME,
            prompt=prompts,
            max_tokens=30,
            temperature=0,
            logprobs=1,
            echo=True,
            extra_body={"ignore_eos": True},
        )
        assert server.metrics()["hyserve:num_preemptions_total"] > 0
    for ids, choice in zip(prompts, out.choices):
        lp = choice.logprobs
        assert len(lp.token_logprobs) == len(ids) + 30
        greedy = reference.greedy(ids, 30, stop_at_eos=False)
        assert lp.tokens[len(ids) :] == [reference.tok.decode([t]) for t in greedy]
        expected = reference.logprobs(ids + greedy)
        targets = torch.tensor(ids[1:] + greedy)
        want = expected[:-1].gather(1, targets[:, None])[:, 0]
        assert lp.token_logprobs[0] is None
        assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), want, atol=TOL)


def test_tokenizer_fixture_is_what_transformers_loads(tok):
    """The fixture is only a valid stand-in if transformers (which rebuilds Qwen's pipeline from the vocab
    and merges) and the ``tokenizers`` file agree on it."""
    raw = Tokenizer.from_file(str(text_checkpoint() / "tokenizer.json"))
    assert type(tok).__name__ == "Qwen3_5Tokenizer" and len(tok) == TOKENIZER_SIZE
    assert tok.eos_token == "<|im_end|>"
    for text in [*PROMPTS, "<|im_start|>user\nhi<|im_end|>\n", "Ünïcödé 🙂 中文\n\n  x", "it's 12 o'clock"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == raw.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(ids) == raw.decode(ids, skip_special_tokens=False) == text
