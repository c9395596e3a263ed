"""``hyserve bench`` against hyserve's own server on the CPU: table, JSON and plot."""

from __future__ import annotations

import json
from pathlib import Path

from hyserve.bench import run_bench
from server_harness import MODEL_NAME, BackgroundServer, text_checkpoint
from test_bench import parse
from tokenizer_fixture import CHECKPOINT_VOCAB


def test_bench_against_the_hyserve_server(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench"
    model_dir = text_checkpoint()
    with BackgroundServer(model_dir) as server:
        args = parse(
            *("--url", server.url, "--model", MODEL_NAME, "--out", str(out), "--no-progress"),
            *("--vocab-size", str(CHECKPOINT_VOCAB), "--warmup", "1", "--scenario", "all"),
            *("--prompt-len", "12", "--output-len", "6", "--num-prompts", "6", "--concurrency", "1,3"),
            *("--prompt-lens", "8,40", "--ttft-reps", "2", "--ttft-output-len", "1"),
            *("--model-dir", str(model_dir), "--gpu", "h200"),
        )
        assert run_bench(args) == 0
        engine = server.engine
        assert not engine.requests
        assert engine.cache_manager.num_free_blocks == engine.cache_manager.config.num_blocks
    table = capsys.readouterr().out
    assert "throughput" in table and "ttft" in table and "decode" in table and "roofline" in table
    report = json.loads((out / "results.json").read_text())
    rows = {r["label"]: r for r in report["results"]}
    for row in report["results"]:
        assert row["ok"] and row["failed"] == 0 and row["missing_usage"] == 0
        assert row["output_tokens"] == row["num_requests"] * row["output_len"]
    assert rows["throughput c=3"]["output_tok_s"] > 0
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_model_without_tokenizer_streams_a_chunk_per_token(tmp_path: Path) -> None:
    """Token-id prompts to a model folder with no tokenizer files (like ``--load-format dummy`` on the
    config folder): the text is empty, yet the tokens stream as they come, so the bench times them."""
    import asyncio

    import aiohttp

    from checkpoints import make_checkpoint
    from hyserve.bench.client import completion_payload, stream_completion

    model_dir = make_checkpoint(tmp_path / "no-tokenizer", seed=4)

    async def one(url: str):
        async with aiohttp.ClientSession() as session:
            return await stream_completion(session, url, completion_payload(MODEL_NAME, [5, 6, 7, 8], 9), {})

    with BackgroundServer(model_dir) as server:
        res = asyncio.run(one(server.url))
    assert res.ok and res.completion_tokens == 9
    # a chunk per step with new tokens (steps that finish while the stream is busy share one), not one
    # chunk at the end
    assert 1 < len(res.chunk_times_s) <= 9
    assert res.ttft_s == res.chunk_times_s[0] < res.chunk_times_s[-1]
