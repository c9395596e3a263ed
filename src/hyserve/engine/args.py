"""Command-line flags of the engine, shared by ``hyserve generate``, ``serve`` and ``verify``."""

from __future__ import annotations

import argparse
from pathlib import Path

from hyserve.engine.llm_engine import EngineArgs

DEMO_MODEL = Path(__file__).resolve().parent.parent / "demo_model"


def add_engine_arguments(parser: argparse.ArgumentParser, model_required: bool = False) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument(
        "--model",
        required=model_required,
        default=None if model_required else str(DEMO_MODEL),
        help="Hugging Face model folder (default: the embedded demo model)",
    )
    g.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model folder)")
    g.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when present")
    g.add_argument("--dtype", choices=["auto", "bfloat16", "float32", "float16"], default="auto")
    g.add_argument("--load-format", choices=["auto", "safetensors", "dummy"], default="auto")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=8192)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--kv-cache-memory-gb", type=float, default=None, help="fixed KV cache size in GiB")
    g.add_argument("--enforce-eager", action="store_true", help="do not capture CUDA graphs")
    g.add_argument("--cuda-graph-sizes", default=None, help="comma-separated decode batch sizes to capture")
    g.add_argument(
        "--prefill-graph-sizes",
        default=None,
        help="comma-separated prompt lengths of whole-prefill CUDA graphs for a lone new prompt (it runs in "
        "the smallest size >= its length; default 128,256,...,4096 within --max-num-batched-tokens and "
        "--max-model-len), or 'none'",
    )
    g.add_argument(
        "--no-greedy-screen",
        dest="greedy_screen",
        action="store_false",
        help="decode greedy requests through the full LM head's logits (default on CUDA: an int8 screen of the "
        "head, then the exact logits of the few rows that can win; same tokens, half the head's bytes)",
    )
    g.add_argument(
        "--no-routed-projections",
        dest="routed_projections",
        action="store_false",
        help="route one-token steps with the MoE router's own launch (default on CUDA: the router's logits "
        "computed by the mixer's projections, layers/routed_projection.py)",
    )
    g.add_argument(
        "--no-mma-projections",
        dest="mma_projections",
        action="store_false",
        help="stream the routed in-projections' bf16 weights in one-token steps (default on CUDA: lossless "
        "12-bit copies decoded into tensor-core operands, 0.75 of the bytes, +1.5 GB for Qwen3.6-35B-A3B; "
        "layers/mma_projections.py)",
    )
    g.add_argument(
        "--mma-experts",
        action="store_true",
        help="keep lossless 12-bit copies of the experts' gate_up and down weights beside their bf16 weights: the "
        "expert kernels of prefills up to ~1024 tokens, batched decode and one-token steps stream the copies through "
        "tensor-core kernels, longer prompts the bf16 weights (~119 GB for Qwen3.6-35B-A3B: run it at "
        "--gpu-memory-utilization 0.95 on the H200; layers/mma_projections.py, kernels/moe/mma_grouped.py, "
        "kernels/moe/mma_pairs.py)",
    )
    g.add_argument(
        "--mma-experts-only",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the experts' lossless 12-bit copies alone: their bf16 weights are released once the copies exist, so "
        "Qwen3.6-35B-A3B takes ~54 GB instead of ~70 GB and every expert kernel streams 0.75 of the bytes (H100, "
        "whole model: decode 492 tok/s against 428 on the bf16 experts, c=32 1936 against 1701 tok/s; prompts from ~2048 "
        "tokens prefill slower). Default: on for a bf16 MoE checkpoint on CUDA "
        "unless --mma-experts is given; --no-mma-experts-only keeps the bf16 experts alone (the reference path, "
        "hyserve verify --paths reference, needs them)",
    )
    g.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="skip compiling the prefill kernels at start-up",
    )


def engine_args_from(ns: argparse.Namespace) -> EngineArgs:
    if not 0.0 < ns.gpu_memory_utilization <= 1.0:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {ns.gpu_memory_utilization}")
    return EngineArgs(
        model=ns.model,
        tokenizer=ns.tokenizer,
        device=ns.device,
        dtype=ns.dtype,
        load_format=ns.load_format,
        seed=ns.seed,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        max_model_len=ns.max_model_len,
        block_size=ns.block_size,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        kv_cache_memory_gb=ns.kv_cache_memory_gb,
        enforce_eager=ns.enforce_eager,
        cuda_graph_sizes=_sizes(ns.cuda_graph_sizes, "--cuda-graph-sizes"),
        prefill_graph_sizes=_prefill_sizes(ns.prefill_graph_sizes),
        warmup=ns.warmup,
        greedy_screen=ns.greedy_screen,
        routed_projections=ns.routed_projections,
        mma_projections=ns.mma_projections,
        mma_experts=ns.mma_experts,
        mma_experts_only=ns.mma_experts_only,
    )


def _sizes(text: str | None, flag: str) -> list[int] | None:
    if not text:
        return None
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated positive integers, got {text!r}") from None
    if any(x < 1 for x in sizes):
        raise ValueError(f"{flag} takes comma-separated positive integers, got {text!r}")
    return sizes


def _prefill_sizes(text: str | None) -> list[int] | None:
    if text is not None and text.strip().lower() == "none":
        return []
    return _sizes(text, "--prefill-graph-sizes")
