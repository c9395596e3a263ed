"""``hyserve verify`` on the CPU: the engine against transformers on the same tiny weights, fp32."""

from __future__ import annotations

import json

from checkpoints import make_checkpoint
from hyserve.cli import main


def test_verify_passes_on_a_tiny_moe_checkpoint(tmp_path):
    model_dir = make_checkpoint(tmp_path / "moe", seed=3)
    report = tmp_path / "verify.json"
    args = ["verify", "--model", str(model_dir), "--device", "cpu", "--greedy-tokens", "12"]
    assert main([*args, "--paths", "reference", "--json", str(report)]) == 0
    (r,) = json.loads(report.read_text())
    assert r["passed"] and r["dtype"] == "float32"
    assert r["engine"]["rel_logit_error"] < 1e-4
    assert r["engine_alone"]["rel_logit_error"] < 1e-4  # each prompt alone: attention over its own rows
    assert r["greedy_match"] == [12, 12, 12]  # first prompt alone, the other two joining while it decodes
