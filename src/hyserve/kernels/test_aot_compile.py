"""The decode-step and DeltaNet kernels compile for sm_90 (Hopper) on a machine without a GPU.

The CPU interpreter runs code the GPU compiler rejects; these builds catch that in CI. They run in a fresh
interpreter without ``TRITON_INTERPRET`` (under it ``@triton.jit`` makes functions that only interpret).
Skipped where the Triton wheel has no NVIDIA backend (ptxas) to compile with.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton.backends.nvidia") is None, reason="no Triton NVIDIA backend"
)


@pytest.mark.parametrize(
    "module", ["hyserve.kernels.aot_check", "hyserve.kernels.gated_delta_rule.aot_check"]
)
def test_kernels_compile_for_sm90(module):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "FAIL" not in run.stdout and run.stdout.count("ok ") >= 8
