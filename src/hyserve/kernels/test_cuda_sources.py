"""The CUDA C++ kernels that ``kernels/nvrtc.py`` compiles at run time build for sm_90a with nvcc, every warning an
error, on a machine without a GPU (skipped where nvcc is not installed): the instances the plans launch, each PDL
on and off (the grouped wgmma kernel also without its L2 lookahead). The GPU tests run them against their
references; this catches a source that no longer builds, or builds with a warning (a member template called
without ``template`` on a dependent type built with "expression has no effect"), before a device session does."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")


def _b(v: bool) -> str:
    return str(v).lower()


def _params(source: str, name: str) -> str:
    """The parameter list of ``__global__`` template ``name`` in source, as written."""
    m = re.search(r"__global__ void (?:__launch_bounds__\([^)]*\) )?" + name + r"\(", source)
    assert m, name
    depth, i = 1, m.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        i += 1
    return source[m.end() : i - 1]


def _sources() -> list[tuple[str, str, list[str]]]:
    """(label, source, template instances) of each NVRTC source."""
    from hyserve.kernels.mma_gemv.cuda_kernel import SOURCE as GEMV
    from hyserve.kernels.mma_gemv.cuda_kernel import SPLITS
    from hyserve.kernels.moe.mma_grouped import L2_AHEAD, PLANS, UNPLANNED_TILES
    from hyserve.kernels.moe.mma_pairs import GATE_UP_TILES, KSPLITS
    from hyserve.kernels.moe.mma_pairs import SOURCE as PAIRS
    from hyserve.kernels.routed_projection.mma_kernel import SOURCE as ROUTE

    pdl = (True, False)
    gemv = [f"gemv_mma<{s}, {_b(n)}, {_b(p)}>" for s in SPLITS for n in (True, False) for p in pdl]
    grouped = []
    for bm, (warps, rt, depth) in [*PLANS.items(), (128, UNPLANNED_TILES)]:
        for down in (False, True):
            for p in pdl:
                if depth:
                    grouped += [
                        f"grouped_wgmma<{bm // 8}, {warps}, {depth}, {ahead}, {_b(down)}, {_b(p)}>"
                        for ahead in sorted({0, L2_AHEAD})
                    ]
                else:
                    grouped.append(f"grouped_mma<{bm // 8}, {warps}, {rt}, {_b(down)}, {_b(p)}>")
    pairs = [f"down_pairs_mma<9, {ks}, {4 // ks}, {_b(p)}>" for ks in KSPLITS for p in pdl]
    pairs += [f"gate_up_pairs_mma<{GATE_UP_TILES[0]}, {GATE_UP_TILES[1]}, {_b(p)}>" for p in pdl]
    route = [f"project_route_mma<{s}, {k}, {_b(p)}>" for s, k in ((4, 4), (8, 2)) for p in pdl]
    return [("gemv", GEMV, gemv), ("grouped+pairs", PAIRS, grouped + pairs), ("route", ROUTE, route)]


@pytest.mark.parametrize("label", ["gemv", "grouped+pairs", "route"])
def test_cuda_sources_build_for_sm90a_without_warnings(label, tmp_path):
    _, source, instances = next(s for s in _sources() if s[0] == label)
    lines = [f"template __global__ void {inst}({_params(source, inst.split('<')[0])});" for inst in instances]
    cu = tmp_path / "k.cu"
    cu.write_text(source + "\n" + "\n".join(lines) + "\n")
    run = subprocess.run(
        [
            "nvcc",
            "-arch=sm_90a",
            "-cubin",
            "-Werror",
            "all-warnings",
            "-o",
            str(tmp_path / "k.cubin"),
            str(cu),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
