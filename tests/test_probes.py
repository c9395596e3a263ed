"""The GPU probes in ``scripts/`` still run: their CPU mode (interpreter, tiny shapes) checks their kernels'
math against torch, so a probe is not first found broken on the device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the probe times the full-size chain")
def test_persistent_gemv_probe_matches_torch() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "probe_persistent_gemv.py")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    errs = [float(line.split()[-1]) for line in run.stdout.splitlines() if "rel err against torch" in line]
    assert len(errs) == 3 and max(errs) < 1e-5  # fp32 on the CPU: the three variants agree with torch
