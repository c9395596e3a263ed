"""``hyserve bench`` against a fake streaming server, and the roofline arithmetic."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from fake_openai_server import FakeOpenAIServer
from hyserve.bench import add_bench_arguments, roofline, run_bench
from hyserve.bench.__main__ import main as bench_main

# Qwen3.6-35B-A3B, the fields the roofline reads (nested like the real multimodal config.json)
QWEN36_35B = {
    "model_type": "qwen3_5_moe",
    "text_config": {
        "model_type": "qwen3_5_moe_text",
        "hidden_size": 2048,
        "num_hidden_layers": 40,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 10,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "attn_output_gate": True,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32",
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "vocab_size": 248320,
    },
}
H200 = roofline.GPUS["h200"]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    return parser.parse_args(list(argv))


def small_args(url: str, out: Path, *extra: str) -> argparse.Namespace:
    return parse(
        *("--url", url, "--out", str(out), "--no-progress", "--vocab-size", "5000", "--warmup", "1"),
        *("--prompt-len", "16", "--output-len", "7", "--num-prompts", "8"),
        *("--prompt-lens", "8,32", "--ttft-reps", "3", "--ttft-output-len", "2"),
        *extra,
    )


def test_bench_all_scenarios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["hyserve", "bench", "--api-key", "sekrit"])  # must not reach the JSON
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(QWEN36_35B))
    out = tmp_path / "out"
    # two tokens per chunk: the token count must come from usage, not from the chunks
    with FakeOpenAIServer(
        token_delay_s=0.004, prefill_s_per_token=5e-4, tokens_per_chunk=2, api_key="sekrit"
    ) as srv:
        extra = ("--concurrency", "1,2,4", "--api-key", "sekrit", "--model-dir", str(model_dir))
        rc = run_bench(small_args(srv.url + "/v1/", out, *extra))
    assert rc == 0
    table = capsys.readouterr().out
    for word in (
        "scenario",
        "out tok/s",
        "TTFT med",
        "TPOT p99",
        "roofline tok/s",
        "% roofline",
        "decode",
        "ttft",
    ):
        assert word in table
    assert "(!)" not in table
    assert srv.max_in_flight == 4  # the largest level, kept full

    body = srv.requests[-1]
    assert body["model"] == "fake-model"  # discovered through GET /v1/models
    assert body["ignore_eos"] is True and body["stream"] is True and body["temperature"] == 0
    assert body["stream_options"] == {"include_usage": True}
    assert len(body["prompt"]) == 16 and all(1000 <= t < 5000 for t in body["prompt"])
    assert len({tuple(b["prompt"]) for b in srv.requests}) == len(srv.requests)  # fresh prompts

    doc = json.loads((out / "results.json").read_text())
    assert set(doc) == {"schema_version", "params", "roofline", "results"}
    assert doc["params"]["url"] == srv.url and doc["params"]["model"] == "fake-model"
    assert "sekrit" not in json.dumps(doc)
    assert doc["roofline"]["gpu"] == "h200"
    labels = [e["label"] for e in doc["results"]]
    assert labels == [
        "decode c=1",
        "ttft p=8",
        "ttft p=32",
        "throughput c=1",
        "throughput c=2",
        "throughput c=4",
    ]
    for e in doc["results"]:
        assert e["ok"] and e["failed"] == 0 and e["completed"] == e["num_requests"]
        assert e["output_tokens"] == e["num_requests"] * e["output_len"]
        assert e["output_tok_s"] > 0
        assert e["ttft_ms"]["median"] < e["e2e_ms"]["median"]
        for r in e["requests"]:
            assert r["completion_tokens"] == r["max_tokens"] == e["output_len"]
            assert r["usage_reported"] and r["chunks"] == (e["output_len"] + 1) // 2
            assert 0 < r["ttft_ms"] < r["e2e_ms"] and r["tpot_ms"] > 0
        if e["scenario"] == "ttft":
            assert e["num_requests"] == 3 and e["ttft_floor_ms"] > 0 and e["roofline_tok_s"] is None
        else:
            assert e["roofline_tok_s"] > 0 and e["roofline_pct"] > 0
    ttft = {e["prompt_len"]: e["ttft_ms"]["median"] for e in doc["results"] if e["scenario"] == "ttft"}
    assert ttft[32] > ttft[8]  # 16 ms vs 4 ms of fake prefill
    thr = {e["concurrency"]: e for e in doc["results"] if e["scenario"] == "throughput"}
    assert thr[4]["output_tok_s"] > 1.5 * thr[1]["output_tok_s"]  # the requests really overlapped
    assert thr[4]["roofline_tok_s"] > thr[1]["roofline_tok_s"]
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_reports_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeOpenAIServer(fail_every=3) as srv:
        extra = ("--scenario", "throughput", "--concurrency", "2", "--num-prompts", "9", "--warmup", "0")
        rc = run_bench(small_args(srv.url, tmp_path, *extra, "--model", "fake-model"))
    assert rc == 1
    table = capsys.readouterr().out
    assert "throughput (!)" in table and "3/9 requests FAILED" in table and "HTTP 500" in table
    (e,) = json.loads((tmp_path / "results.json").read_text())["results"]
    assert not e["ok"] and e["failed"] == 3 and e["completed"] == 6
    assert e["output_tokens"] == 6 * 7
    assert sum(e["errors"].values()) == 3 and all(k.startswith("HTTP 500") for k in e["errors"])


def test_bench_without_usage_counts_chunks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeOpenAIServer(send_usage=False) as srv:
        rc = run_bench(small_args(srv.url, tmp_path, "--scenario", "decode"))
    assert rc == 0
    assert "decode (!)" in capsys.readouterr().out
    (e,) = json.loads((tmp_path / "results.json").read_text())["results"]
    assert e["missing_usage"] == 1 and not e["ok"] and e["output_tokens"] == 7


def test_bench_cli_errors(tmp_path: Path) -> None:
    assert bench_main(["--scenario", "bogus", "--out", str(tmp_path)]) == 2
    with FakeOpenAIServer() as srv:
        url = srv.url  # nothing listens here once the server has stopped
    argv = ["--url", url, "--model", "m", "--scenario", "decode", "--out", str(tmp_path), "--no-progress"]
    assert bench_main(argv) == 1
    assert not (tmp_path / "results.json").exists()


def test_roofline_qwen36_35b() -> None:
    # 2.945 G params read at B=1 (experts 8 of 256) = 5.89 GB bf16, + 126 MB of GDN state read and written
    assert roofline.weight_bytes_per_step(QWEN36_35B, 1) == pytest.approx(5.89e9, rel=0.01)
    assert roofline.decode_floor_tok_s(QWEN36_35B, 1, 0, H200) == pytest.approx(665, rel=0.02)
    assert roofline.decode_floor_tok_s(QWEN36_35B, 1, 640, H200) == pytest.approx(665, rel=0.02)
    per_seq = [
        roofline.decode_floor_tok_s(QWEN36_35B, b, 1280, H200) / b for b in (1, 2, 4, 8, 16, 32, 64, 256)
    ]
    assert all(a > b for a, b in zip(per_seq, per_seq[1:]))
    total = [p * b for p, b in zip(per_seq, (1, 2, 4, 8, 16, 32, 64, 256))]
    assert all(a < b for a, b in zip(total, total[1:]))
    assert roofline.expected_distinct_experts(256, 8, 1) == pytest.approx(8)
    assert roofline.expected_distinct_experts(256, 8, 4096) == pytest.approx(256)
    assert roofline.active_params_per_token(QWEN36_35B) == pytest.approx(2.945e9, rel=0.01)
    # throughput floor without prefill is C / step time; with prefill it is lower
    c = 8
    step = roofline.decode_step_time_s(QWEN36_35B, c, 1024 + 256, H200)
    assert roofline.throughput_floor_tok_s(QWEN36_35B, c, 1024, 512, H200) == pytest.approx(c / step)
    assert roofline.throughput_floor_tok_s(QWEN36_35B, c, 1024, 512, H200, include_prefill=True) < c / step
    # an idle prefill of 4096 tokens touches every expert and is slower than a 128-token one
    assert roofline.prefill_floor_s(QWEN36_35B, 4096, H200) > roofline.prefill_floor_s(QWEN36_35B, 128, H200)


def test_roofline_dense_qwen3_5() -> None:
    cfg = {
        "model_type": "qwen3_5_text",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "full_attention_interval": 4,  # layers 0-2 GDN, layer 3 attention
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "linear_num_key_heads": 8,
        "linear_num_value_heads": 16,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "intermediate_size": 3072,
        "vocab_size": 10000,
    }
    h, kd, vd = 1024, 8 * 64, 16 * 64
    gdn = h * (2 * kd + vd) + h * vd + 2 * h * 16 + vd * h
    attn = h * 2 * 8 * 128 + 2 * h * 2 * 128 + 8 * 128 * h
    params = 3 * gdn + attn + 4 * 3 * h * 3072 + 10000 * h
    for b in (1, 64):  # dense: the bytes do not depend on the batch
        assert roofline.weight_bytes_per_step(cfg, b, weight_bytes=1) == params
    assert roofline.active_params_per_token(cfg) == params
    assert roofline.state_bytes_per_step(cfg, 2, 10) == 2 * (2 * 3 * 16 * 64 * 64 * 4 + 10 * 2 * 2 * 128 * 2)
