"""A tiny Qwen-layout byte-level BPE tokenizer, and tiny checkpoints that carry it, for text-level tests.

The layout follows Qwen's ``tokenizer.json`` (NFC, the Qwen split regex then ByteLevel without its own
regex, a ByteLevel decoder) because transformers maps model type ``qwen3_5_moe`` to ``Qwen3_5Tokenizer``,
which rebuilds exactly that pipeline from the vocab and merges: any other layout would make transformers
and ``tokenizers`` disagree on the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from checkpoints import make_checkpoint

QWEN_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_TOKEN = "<|im_end|>"
TOKENIZER_SIZE = 384  # 3 special + 256 byte-level + 125 merges
CHECKPOINT_VOCAB = 400  # padded past the tokenizer, like Qwen's embedding table
CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)
# the merges are learnt from this text, so common English pieces become multi-byte tokens
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.",
    "Hello, world! Hello there, how are you today? I am fine, thank you.",
    "Once upon a time there was a little model that wanted to generate text.",
    "Numbers like 1234 and 56.78 are split into digits; code: def f(x): return x + 1",
    "Ünïcödé text, emoji 🙂 and 中文 also appear sometimes in the input stream.",
]


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tok


def write_tokenizer(path: Path) -> None:
    """tokenizer.json, tokenizer_config.json (ChatML template) and generation_config.json (EOS ids)."""
    tok = build_tokenizer()
    tok.save(str(path / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 1024,
        "eos_token": EOS_TOKEN,
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "bos_token": None,
        "add_prefix_space": False,
        "chat_template": CHATML,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
                "special": True,
            }
            for t, i in ids.items()
        },
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    generation = {
        "eos_token_id": [ids[EOS_TOKEN], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    }
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))


def make_text_checkpoint(path: Path, seed: int = 0, **overrides) -> Path:
    """A tiny random MoE checkpoint with the tokenizer above; the embedding table covers the tokenizer."""
    make_checkpoint(path, kind="moe", seed=seed, **({"vocab_size": CHECKPOINT_VOCAB} | overrides))
    write_tokenizer(path)
    return path
