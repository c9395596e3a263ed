"""Train the embedded demo model (``src/hyserve/demo_model``): a tiny ``qwen3_5_moe`` that adds integers.

The model is transformers' own ``Qwen3_5MoeForCausalLM`` (Gated DeltaNet + gated attention + MoE), trained from
scratch on the synthetic task of ``hyserve.demo_task`` with a fixed seed, on the CPU, in a few minutes::

    .venv/bin/python scripts/train_demo.py                 # writes src/hyserve/demo_model
    .venv/bin/python scripts/train_demo.py --out /tmp/demo  # somewhere else

It writes a complete Hugging Face model folder: ``config.json``, ``model.safetensors``, ``generation_config.json``,
``tokenizer.json`` (a byte-level BPE in Qwen's layout), ``tokenizer_config.json`` and ``chat_template.jinja``
(the same ChatML + thinking template in both) and ``README.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "src" / "hyserve" / "demo_model"

# Qwen's pre-tokenizer regex (the one transformers' Qwen3_5Tokenizer rebuilds): digits split one by one.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Added tokens after the regular vocabulary, named and flagged like Qwen3.5's.
SPECIAL_TOKENS = [  # (content, special)
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
]
VOCAB_MULTIPLE = 64  # the embedding is padded past the tokenizer like Qwen's (248320 > len(tokenizer))

# ChatML with Qwen3.x's thinking blocks, thinking OFF unless enable_thinking=True. Simplified from Qwen3.6's
# template: system / user / assistant (reasoning_content, tool_calls in Qwen's XML layout) / tool messages and
# an optional tools list. Every assistant turn carries its think block (empty when there is no reasoning), so
# a rendered conversation extends the rendered generation prompt exactly.
CHAT_TEMPLATE = """\
{%- set enable_thinking = enable_thinking if enable_thinking is defined else false -%}
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is none -%}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part.type == 'text' -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content -}}
    {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
    {{- '<|im_start|>system\\n' -}}
    {%- if messages and messages[0].role == 'system' -%}
        {{- render_content(messages[0].content) + '\\n\\n' -}}
    {%- endif -%}
    {{- '# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\\n</tools>\\n\\nTo call a function, reply with:\\n<tool_call>\\n<function=example_function_name>\\n'
        '<parameter=example_parameter>\\nvalue\\n</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- set content = render_content(message.content) -%}
    {%- if message.role == 'system' -%}
        {%- if not (tools and loop.first) -%}
            {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' -}}
        {%- endif -%}
    {%- elif message.role == 'user' -%}
        {{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set reasoning = '' -%}
        {%- if message.reasoning_content is string -%}
            {%- set reasoning = message.reasoning_content -%}
        {%- elif '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
        {%- endif -%}
        {%- set reasoning = reasoning.strip('\\n') -%}
        {{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' -}}
        {{- content -}}
        {%- if message.tool_calls -%}
            {%- for tool_call in message.tool_calls -%}
                {%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
                {%- if not loop.first or content -%}
                    {{- '\\n' -}}
                {%- endif -%}
                {{- '<tool_call>\\n<function=' + call.name + '>\\n' -}}
                {%- if call.arguments is mapping -%}
                    {%- for name, value in call.arguments.items() -%}
                        {{- '<parameter=' + name + '>\\n' -}}
                        {{- (value if value is string else value | tojson) + '\\n</parameter>\\n' -}}
                    {%- endfor -%}
                {%- elif call.arguments -%}
                    {{- call.arguments + '\\n' -}}
                {%- endif -%}
                {{- '</function>\\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- raise_exception('Unexpected message role: ' + message.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
    {%- if enable_thinking -%}
        {{- '<think>\\n' -}}
    {%- else -%}
        {{- '<think>\\n\\n</think>\\n\\n' -}}
    {%- endif -%}
{%- endif -%}
"""


def load_demo_task():
    """``hyserve/demo_task.py`` by path (stdlib only), without importing the whole ``hyserve`` package."""
    path = ROOT / "src" / "hyserve" / "demo_task.py"
    spec = importlib.util.spec_from_file_location("hyserve_demo_task", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------------------------- tokenizer
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the ByteLevel alphabet), in its canonical order."""
    bs = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def train_merges(corpus: list[str], max_merges: int) -> list[tuple[str, str]]:
    """BPE merges learned on ``corpus`` (BpeTrainer over the Qwen pre-tokenizer, min frequency 2)."""
    from tokenizers import Tokenizer, models, normalizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer()
    alphabet = list(bytes_to_unicode().values())
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + max_merges,
        min_frequency=2,
        initial_alphabet=alphabet,
        show_progress=False,
        special_tokens=[],
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]


def build_tokenizer(merges: list[tuple[str, str]]):
    """The byte-level BPE in Qwen's layout: ids 0..255 are the byte symbols in GPT-2 order, then one token per
    merge, then the added tokens (``<|endoftext|>`` first)."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    tok = Tokenizer(
        BPE(
            vocab=vocab,
            merges=list(merges),
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(
        [
            AddedToken(
                content, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False
            )
            for content, special in SPECIAL_TOKENS
        ]
    )
    return tok


def merge_corpus(task, n: int = 2000, seed: int = 0) -> list[str]:
    """Text the merges are learned on: the task in both layouts plus the template's role names."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        question, answer = task.make_problem(rng)
        texts.append(task.render_chat_prompt(question) + answer)
        texts.append(task.plain_prompt(question) + answer)
    texts += ["system", "user", "assistant", "tool"] * 10
    # The added tokens are never split, so they stay out of the merges.
    pieces = []
    for text in texts:
        for content, _ in SPECIAL_TOKENS:
            text = text.replace(content, "\x00")
        pieces += [p for p in text.split("\x00") if p]
    return pieces


def write_tokenizer(out: Path, tok) -> dict[str, int]:
    """``tokenizer.json``, ``tokenizer_config.json`` (chat template inside) and ``chat_template.jinja``."""
    tok.save(str(out / "tokenizer.json"))
    ids = {content: tok.token_to_id(content) for content, _ in SPECIAL_TOKENS}
    added = {
        str(ids[content]): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for content, special in SPECIAL_TOKENS
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 512,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return ids


# ----------------------------------------------------------------------------------------------- model
def model_config(vocab_size: int, ids: dict[str, int], args):
    from transformers import Qwen3_5MoeTextConfig

    return Qwen3_5MoeTextConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        layer_types=[
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(args.layers)
        ],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=args.moe_inter,
        shared_expert_intermediate_size=args.moe_inter,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        router_aux_loss_coef=0.001,
        bos_token_id=None,
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        architectures=["Qwen3_5MoeForCausalLM"],
    )


def use_short_chunks(chunk_size: int) -> None:
    """Training-time speed-up: transformers' own reference chunked delta rule, with chunks that fit the short
    training sequences (its default 64 pads every sequence to 64). The result is the same up to rounding."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m

    m.torch_chunk_gated_delta_rule = partial(m.torch_chunk_gated_delta_rule, chunk_size=chunk_size)


class Batches:
    """Training examples of the task drawn from a seeded RNG: the chat layout (rendered by the chat template)
    or, with probability ``plain_frac``, the plain layout. Loss only on the answer and its end token."""

    def __init__(self, task, tok, ids, seed: int, plain_frac: float):
        self.task, self.tok, self.rng, self.plain_frac = task, tok, random.Random(seed), plain_frac
        self.im_end, self.eot = ids["<|im_end|>"], ids["<|endoftext|>"]

    def example(self) -> tuple[list[int], int]:
        question, answer = self.task.make_problem(self.rng)
        if self.rng.random() < self.plain_frac:
            prompt, end = self.task.plain_prompt(question), self.eot
        else:
            prompt, end = self.task.render_chat_prompt(question), self.im_end
        p = self.tok.encode(prompt).ids
        return p + self.tok.encode(answer).ids + [end], len(p)

    def __call__(self, batch_size: int):
        import torch

        examples = [self.example() for _ in range(batch_size)]
        width = max(len(x) for x, _ in examples)
        input_ids = torch.full((batch_size, width), self.eot, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        for i, (x, n_prompt) in enumerate(examples):
            input_ids[i, : len(x)] = torch.tensor(x)
            labels[i, n_prompt : len(x)] = torch.tensor(x[n_prompt:])
        return input_ids, labels  # right padding: causal, so no attention mask is needed


def greedy_accuracy(model, tok, task, problems, mode: str, max_new: int = 6) -> float:
    """Quick greedy exact match without a KV cache (answers are a few tokens), batched with left padding."""
    import torch

    prompts = task.prompts_for([q for q, _ in problems], mode)
    if mode == "chat":
        prompts = [task.render_chat_prompt(q) for q in prompts]
    enc = [tok.encode(p).ids for p in prompts]
    pad = tok.token_to_id("<|endoftext|>")
    ends = {tok.token_to_id("<|im_end|>"), pad}
    width = max(map(len, enc))
    device = next(model.parameters()).device
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc], device=device)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], device=device)
    out = [[] for _ in enc]
    done = [False] * len(enc)
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -1]
            nxt = logits.argmax(-1)
            for i, t in enumerate(nxt.tolist()):
                if not done[i]:
                    if t in ends:
                        done[i] = True
                    else:
                        out[i].append(t)
            ids = torch.cat([ids, nxt[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    texts = [tok.decode(o) for o in out]
    return sum(task.score(a, g) for (_, a), g in zip(problems, texts)) / len(problems)


def train(model, batches, args, log) -> tuple[float, float]:
    """Returns the loop's wall-clock and CPU seconds."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))

    model.train()
    t0, cpu0 = time.time(), time.process_time()
    running = None
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        input_ids, labels = (t.to(args.device) for t in batches(args.batch))
        out = model(input_ids=input_ids, labels=labels, output_router_logits=True, use_cache=False)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = out.loss.item()
        running = loss if running is None else 0.98 * running + 0.02 * loss
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            log(f"step {step + 1:5d}  loss {running:.4f}  lr {lr_at(step):.2e}  {time.time() - t0:6.1f}s")
        if args.eval_every and (step + 1) % args.eval_every == 0:
            model.eval()
            acc = greedy_accuracy(model, batches.tok, batches.task, args.eval_problems, "chat")
            acc_p = greedy_accuracy(model, batches.tok, batches.task, args.eval_problems, "plain")
            log(f"           chat acc {acc:.3f}  plain acc {acc_p:.3f}")
            model.train()
    return time.time() - t0, time.process_time() - cpu0


def save(
    model, ids: dict[str, int], args, n_params: int, seconds: tuple[float, float], acc: dict[str, float], task
) -> None:
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        do_sample=False,
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        max_new_tokens=16,
    )
    model.config.use_cache = True
    model.save_pretrained(str(args.out))
    size = (args.out / "model.safetensors").stat().st_size
    # the check a user would run: the saved folder through transformers' AutoModel/AutoTokenizer and generate()
    hf_acc = {
        mode: task.evaluate(task.transformers_generate_fn(args.out, mode=mode), n=100, seed=1234, mode=mode)
        for mode in task.MODES
    }
    print(f"through transformers.generate, evaluate(n=100): {hf_acc}", flush=True)
    (args.out / "README.md").write_text(
        README.format(
            n_params=n_params,
            size_mb=size / 1e6,
            hidden=args.hidden,
            layers=args.layers,
            layer_types=", ".join(model.config.layer_types),
            moe_inter=args.moe_inter,
            vocab=model.config.vocab_size,
            n_tokens=len(ids) + min(ids.values()),
            first_special=min(ids.values()),
            n_merges=min(ids.values()) - 256,
            im_end=ids["<|im_end|>"],
            eot=ids["<|endoftext|>"],
            steps=args.steps,
            batch=args.batch,
            lr=args.lr,
            warmup=args.warmup,
            wd=args.wd,
            plain_pct=round(100 * args.plain_frac),
            seed=args.seed,
            minutes=seconds[0] / 60,
            cpu_minutes=seconds[1] / 60,
            threads=args.threads,
            device=args.device,
            chat_acc=100 * acc["chat"],
            plain_acc=100 * acc["plain"],
            hf_chat=100 * hf_acc["chat"],
            hf_plain=100 * hf_acc["plain"],
        )
    )


README = """\
# hyserve demo model

A tiny model of the exact `qwen3_5_moe` architecture (`Qwen3_5MoeForCausalLM`, flat text config
`qwen3_5_moe_text`): Gated DeltaNet linear attention + gated full attention + a mixture of experts. It was trained
from scratch by `scripts/train_demo.py` and ships inside the package so that hyserve gives real answers offline.

## Task

Integer addition of two operands of 1 or 2 digits (`hyserve/demo_task.py`):

* chat: the user asks `What is 47+85?`; the reply is `132<|im_end|>` (thinking is off by default, so the
  generation prompt already holds the empty `<think>\\n\\n</think>\\n\\n` block);
* plain text: `47+85=` is completed with `132<|endoftext|>`.

Greedy exact match after training: chat {chat_acc:.1f}%, plain {plain_acc:.1f}% on 500 fixed problems (the
training script's own greedy loop); through transformers' `generate` (`demo_task.transformers_generate_fn`)
chat {hf_chat:.0f}%, plain {hf_plain:.0f}% on `evaluate(n=100, seed=1234)`. `hyserve.demo_task.evaluate(generate_fn)`
measures it through any backend.

## Model

{n_params:,} parameters, float32, `model.safetensors` {size_mb:.1f} MB. hidden {hidden}, {layers} layers:
{layer_types}; 4 attention heads (2 KV heads, head_dim 32, partial rotary 0.25), Gated DeltaNet with 2 key
heads / 4 value heads of dim 32 and a causal conv of width 4, 8 experts (top-2, intermediate {moe_inter}) plus a
shared expert (intermediate {moe_inter}), untied embeddings, vocab_size {vocab} (padded past the tokenizer's
{n_tokens} tokens, like Qwen's).

## Tokenizer

A byte-level BPE in Qwen's layout, built with the `tokenizers` library: NFC normalizer, Qwen's split regex
(digits split one by one) + ByteLevel pre-tokenizer, ByteLevel decoder. Ids 0-255 are the 256 byte symbols
(GPT-2 order), then {n_merges} merges learned on the task text, then the added tokens from id {first_special}:
`<|endoftext|>` (pad), `<|im_start|>`, `<|im_end|>` (eos), `<think>`, `</think>`, `<tool_call>`, `</tool_call>`,
`<tool_response>`, `</tool_response>` (the first three are special; the think and tool tags are not, as in
Qwen3.5, so they survive `skip_special_tokens`). No BOS. transformers loads it as `Qwen3_5Tokenizer`, which
encodes the same ids as the raw `tokenizers` file.

The chat template (ChatML with Qwen3.x thinking blocks, simplified from Qwen3.6's) is in `chat_template.jinja`
and, identical, in `tokenizer_config.json`; `enable_thinking` defaults to false. `generation_config.json`: greedy,
`eos_token_id` [{im_end}, {eot}] (`<|im_end|>`, `<|endoftext|>`).

## Training

transformers' `Qwen3_5MoeForCausalLM`, seed {seed}, AdamW (lr {lr:g}, betas 0.9/0.98, weight decay {wd:g}, {warmup}
warm-up steps then cosine), {steps} steps of {batch} fresh random problems ({plain_pct}% in the plain layout,
the rest rendered by the chat template), loss on the answer tokens and their end token only (plus the router's
load-balancing loss). The training loop took {minutes:.1f} minutes ({cpu_minutes:.1f} minutes of CPU time) on
{device} with {threads} thread(s). Reproduce with

    .venv/bin/python scripts/train_demo.py             # 2 threads
    .venv/bin/python scripts/train_demo.py --threads 1  # on a busy machine: far faster than oversubscribed threads
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--tokenizer-only", action="store_true", help="write the tokenizer files and stop")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--wd", type=float, default=0.01)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--plain-frac", type=float, default=0.25)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--moe-inter", type=int, default=64)
    parser.add_argument(
        "--digits", type=int, default=None, help="override demo_task.MAX_DIGITS (experiments)"
    )
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu (the shipped model) or cuda (experiments)")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=0)
    args = parser.parse_args(argv)

    start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    task = load_demo_task()
    if args.digits:
        task.MAX_DIGITS = args.digits
    tok = build_tokenizer(train_merges(merge_corpus(task), max_merges=64))
    ids = write_tokenizer(args.out, tok)
    print(f"tokenizer: {tok.get_vocab_size()} tokens, specials {ids}", flush=True)
    if args.tokenizer_only:
        return

    import torch
    from transformers import Qwen3_5MoeForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    use_short_chunks(args.chunk)
    vocab_size = -(-tok.get_vocab_size() // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    config = model_config(vocab_size, ids, args)
    model = Qwen3_5MoeForCausalLM(config).to(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters, layers {config.layer_types}", flush=True)
    args.eval_problems = task.make_problems(200, seed=999)
    batches = Batches(task, tok, ids, seed=args.seed + 1, plain_frac=args.plain_frac)
    seconds, cpu_seconds = train(model, batches, args, lambda s: print(s, flush=True))
    model.eval()
    final = task.make_problems(500, seed=1234)
    acc = {mode: greedy_accuracy(model, tok, task, final, mode) for mode in task.MODES}
    print(
        f"trained in {seconds:.0f}s ({cpu_seconds:.0f}s CPU); greedy accuracy on 500 problems: {acc}",
        flush=True,
    )
    save(model.cpu(), ids, args, n_params=n_params, seconds=(seconds, cpu_seconds), acc=acc, task=task)
    print(f"wrote {args.out} in {time.time() - start:.0f}s in all", flush=True)


if __name__ == "__main__":
    main()
