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


def test_waves_on_the_h200():
    """The occupancy arithmetic behind aot_check's waves: registers in 256s a warp, the 2048-thread and 32-CTA
    limits, 1 KB of shared memory reserved a CTA; the batch-1 grids it explained on the H200."""
    from hyserve.kernels.gated_delta_rule.aot_check import waves

    assert waves(1152, 4, 56, 16) == (9, 1152 / (9 * 132))  # the pairs gate_up capped: one wave
    assert waves(1152, 4, 63, 16)[0] == 8  # 63 registers allocate as 64: 1.09 waves
    assert waves(2304, 4, 31, 256) == (16, 2304 / 2112)  # the routing out-projection: the thread limit
    assert waves(2304, 2, 31, 256)[0] == 32  # two warps a CTA: the 32-CTA limit, one wave
    assert waves(64, 4, 32, 200 * 1024)[0] == 1  # shared memory bounds it


def test_ptx_fingerprint_ignores_debug_information_only():
    """aot_check's ``ptx=`` fingerprint: the same code with other line directives, file table, comments, inlining
    labels and debug sections has the same fingerprint (a refactor that moves code between functions); another
    instruction or register changes it."""
    from hyserve.kernels.gated_delta_rule.aot_check import ptx_sha

    body = "\tld.global.b32 \t%r1, [%rd1];\n\tadd.s32 \t%r2, %r1, 1;\n\tst.global.b32 \t[%rd2], %r2;\n"
    a = '.file 1 "a.py"\n\t.loc 1 10 4\n' + body + "\t// end\n.section .debug_info {\n.b8 1\n}\n"
    b = '.file 1 "b.py"\n$L__tmp3:\n\t.loc 1 57 8\n' + body + ".section .debug_abbrev {\n.b8 2\n}\n"
    assert ptx_sha(a) == ptx_sha(b)
    assert ptx_sha(a) != ptx_sha(a.replace("add.s32 \t%r2, %r1, 1", "add.s32 \t%r2, %r1, 2"))
