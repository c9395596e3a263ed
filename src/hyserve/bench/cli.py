"""``hyserve bench`` arguments and driver: run the scenarios, print the table, write JSON and PNG."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from hyserve.bench import roofline
from hyserve.bench.client import (
    MIN_TOKEN_ID,
    auth_headers,
    completion_payload,
    random_prompt,
    stream_completion,
)
from hyserve.bench.report import RooflineModel, format_table, summarize, write_plot
from hyserve.bench.scenarios import SCENARIOS, LevelSpec, Target, plan_levels, run_level

SCHEMA_VERSION = 1
WARMUP_PROMPT_LEN = 128
WARMUP_OUTPUT_LEN = 16


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``hyserve bench`` options to ``parser`` (read back by :func:`run_bench`)."""
    g = parser.add_argument_group("target")
    g.add_argument(
        "--url", default="http://127.0.0.1:8000", help="server base URL (a trailing /v1 is dropped)"
    )
    g.add_argument(
        "--model", default=None, help="model name sent in requests (default: first of GET /v1/models)"
    )
    g.add_argument(
        "--api-key", default=None, help="Bearer token (default: $HYSERVE_API_KEY or $OPENAI_API_KEY)"
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="max seconds between two reads of a response (default 600)",
    )

    g = parser.add_argument_group("workload")
    g.add_argument(
        "--scenario",
        nargs="+",
        default=["all"],
        help=f"one or more of {', '.join(SCENARIOS)}, all (space- or comma-separated; default all)",
    )
    g.add_argument(
        "--prompt-len", type=int, default=None, help="prompt tokens (default: decode 128, throughput 1024)"
    )
    g.add_argument(
        "--output-len", type=int, default=None, help="output tokens for decode/throughput (default 512)"
    )
    g.add_argument(
        "--prompt-lens",
        type=_int_list,
        default=[128, 1024, 4096],
        help="ttft prompt lengths (default 128,1024,4096)",
    )
    g.add_argument(
        "--ttft-reps", type=int, default=5, help="sequential requests per ttft prompt length (default 5)"
    )
    g.add_argument(
        "--ttft-output-len", type=int, default=1, help="max_tokens of the ttft requests (default 1)"
    )
    g.add_argument(
        "--concurrency",
        type=_int_list,
        default=[1, 2, 4, 8, 16, 32, 64],
        help="throughput levels (default 1,2,4,8,16,32,64)",
    )
    g.add_argument(
        "--num-prompts", type=int, default=None, help="requests per throughput level (default max(8, 4*c))"
    )
    g.add_argument(
        "--warmup", type=int, default=2, help="unmeasured requests before the first scenario (default 2)"
    )
    g.add_argument(
        "--vocab-size",
        type=int,
        default=248044,
        help=f"prompt token ids are drawn from [{MIN_TOKEN_ID}, this) (the upper half of a smaller vocabulary)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the random prompts (default 0)")

    g = parser.add_argument_group("output")
    g.add_argument(
        "--out", type=Path, default=None, help="results folder (default bench-results/<timestamp>)"
    )
    g.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=True, help="tqdm bars on stderr"
    )

    g = parser.add_argument_group("roofline (needs --model-dir)")
    g.add_argument("--model-dir", type=Path, default=None, help="Hugging Face model folder with config.json")
    g.add_argument("--gpu", choices=sorted(roofline.GPUS), default="h200", help="GPU ceilings")
    g.add_argument("--hbm-tbps", type=float, default=None, help="override the HBM read bandwidth, TB/s")
    g.add_argument("--tflops", type=float, default=None, help="override the matrix rate, TFLOP/s")
    g.add_argument("--weight-bytes", type=float, default=2.0, help="bytes per weight (2 = bf16)")


def _scenarios(raw: list[str]) -> list[str]:
    names = [n.strip() for item in raw for n in item.split(",") if n.strip()]
    unknown = sorted(set(names) - {*SCENARIOS, "all"})
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}, all")
    if "all" in names:
        return list(SCENARIOS)
    return list(dict.fromkeys(names))


def _check_args(args: argparse.Namespace) -> None:
    positive = {
        "--prompt-len": args.prompt_len,
        "--output-len": args.output_len,
        "--num-prompts": args.num_prompts,
        "--ttft-reps": args.ttft_reps,
        "--ttft-output-len": args.ttft_output_len,
        "--timeout": args.timeout,
        "--weight-bytes": args.weight_bytes,
    }
    for name, value in positive.items():
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.vocab_size < 2:
        raise ValueError(f"--vocab-size must be at least 2, got {args.vocab_size}")


def _roofline_model(args: argparse.Namespace) -> RooflineModel | None:
    if args.model_dir is None:
        return None
    base = roofline.GPUS[args.gpu]
    gpu = roofline.GpuSpec(
        base.name,
        hbm_bytes_per_s=args.hbm_tbps * 1e12 if args.hbm_tbps else base.hbm_bytes_per_s,
        matmul_flops=args.tflops * 1e12 if args.tflops else base.matmul_flops,
    )
    config = roofline.load_config(args.model_dir)
    roofline.model_shape(config)  # fail now, not after the run, on a config it cannot read
    return RooflineModel(config, gpu, args.weight_bytes)


def _git_commit() -> str | None:
    """HEAD of the git checkout this package runs from (``+dirty`` with local changes), if any."""
    here = str(Path(__file__).resolve().parent)

    def git(*cmd: str) -> str:
        return subprocess.run(
            ["git", "-C", here, *cmd], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()

    try:
        head, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def _redacted_argv() -> list[str]:
    """``sys.argv`` with the value of ``--api-key`` replaced by ``***``."""
    argv = list(sys.argv)
    for i, a in enumerate(argv):
        if a == "--api-key" and i + 1 < len(argv):
            argv[i + 1] = "***"
        elif a.startswith("--api-key="):
            argv[i] = "--api-key=***"
    return argv


async def _discover_model(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> str:
    try:
        async with session.get(f"{url}/v1/models", headers=headers) as resp:
            resp.raise_for_status()
            models = (await resp.json())["data"]
        return models[0]["id"]
    except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"--model not given and GET {url}/v1/models failed ({type(e).__name__}: {e})"
        ) from None


def _write_json(
    path: Path, params: dict[str, Any], roof: RooflineModel | None, entries: list[dict[str, Any]]
) -> None:
    doc = {
        "schema_version": SCHEMA_VERSION,
        "params": params,
        "roofline": roof.describe() if roof else None,
        "results": entries,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


async def _run(
    args: argparse.Namespace, url: str, levels: list[LevelSpec], roof: RooflineModel | None, out: Path
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """Run the levels; results.json is rewritten after each one. None when every warmup request failed."""
    headers = auth_headers(
        args.api_key or os.environ.get("HYSERVE_API_KEY") or os.environ.get("OPENAI_API_KEY")
    )
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=args.timeout)
    connector = aiohttp.TCPConnector(limit=max(s.concurrency for s in levels) + 8)
    rng = random.Random(args.seed)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, read_bufsize=2**20) as session:
        model = args.model or await _discover_model(session, url, headers)
        target = Target(url, model, headers, args.vocab_size)
        params = {
            "url": url,
            "model": model,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": _git_commit(),
            "argv": _redacted_argv(),
            "scenarios": sorted({s.scenario for s in levels}, key=SCENARIOS.index),
            "levels": [s.label for s in levels],
            "prompt_len": args.prompt_len,
            "output_len": args.output_len,
            "prompt_lens": args.prompt_lens,
            "ttft_reps": args.ttft_reps,
            "ttft_output_len": args.ttft_output_len,
            "concurrency": args.concurrency,
            "num_prompts": args.num_prompts,
            "warmup": args.warmup,
            "vocab_size": args.vocab_size,
            "seed": args.seed,
            "timeout_s": args.timeout,
            "model_dir": str(args.model_dir) if args.model_dir else None,
        }
        print(f"hyserve bench: {model} at {url}, {len(levels)} levels -> {out}", file=sys.stderr)
        if args.warmup:
            warm = [
                await stream_completion(
                    session,
                    url,
                    completion_payload(
                        model, random_prompt(rng, WARMUP_PROMPT_LEN, args.vocab_size), WARMUP_OUTPUT_LEN
                    ),
                    headers,
                )
                for _ in range(args.warmup)
            ]
            if not any(r.ok for r in warm):
                print(f"hyserve bench: every warmup request failed: {warm[-1].error}", file=sys.stderr)
                return None
        entries: list[dict[str, Any]] = []
        for spec in levels:
            run = await run_level(session, target, spec, rng, progress=args.progress)
            entries.append(summarize(run, roof))
            _write_json(out / "results.json", params, roof, entries)
    return params, entries


def run_bench(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args`` (from :func:`add_bench_arguments`).

    Prints the table to stdout and writes ``results.json`` and ``throughput.png`` to ``args.out``. Returns
    0 when every request succeeded, 1 when any failed (or the server never answered the warmup). Raises
    ``ValueError`` on bad arguments.
    """
    _check_args(args)
    levels = plan_levels(
        _scenarios(args.scenario),
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        prompt_lens=args.prompt_lens,
        ttft_reps=args.ttft_reps,
        ttft_output_len=args.ttft_output_len,
        concurrency=args.concurrency,
        num_prompts=args.num_prompts,
    )
    roof = _roofline_model(args)
    url = args.url.rstrip("/").removesuffix("/v1")
    out = args.out or Path("bench-results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    done = asyncio.run(_run(args, url, levels, roof, out))
    if done is None:
        return 1
    params, entries = done
    print(format_table(entries))
    files = [out / "results.json"]
    if write_plot(entries, out / "throughput.png", f"{params['model']} @ {url}, {params['date']}"):
        files.append(out / "throughput.png")
    print("wrote " + ", ".join(str(f) for f in files))
    return 1 if any(e["failed"] for e in entries) else 0
