"""The whole model through the Triton kernels (CPU interpreter, fp32) against transformers.

The kernel tests check each op alone; this checks how the model wires them: the pre-norms run inside the
GEMV and the fused MoE router, the residual adds in the GEMV's and the MoE down kernel's epilogues, the
DeltaNet and attention decode kernels between. GEMV plans exist only for the real shapes and the MoE
plans for E=256, so both are replaced by small ones that take those paths at the tiny checkpoint's shapes:
the GEMV for every projection at <= 4 rows, the few-token pairs MoE with the fused router at <= 4 tokens.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from checkpoints import load_reference, make_checkpoint
from hyserve import LLM
from hyserve.kernels.moe.test_moe import pairs_plan, small_plan
from hyserve.kernels.testing import rel_err
from test_model_vs_transformers import _score, last_rows_forward

linear_op = importlib.import_module("hyserve.kernels.linear")
triton_moe = importlib.import_module("hyserve.kernels.moe.triton_moe")

REL_TOL = 1e-4
# the interpreter cannot run a kernel once the process has compiled the kernels for a GPU (its nested @triton.jit
# helpers are then compiled functions): there `hyserve verify` and the kernels' own tests cover these paths
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter's model test")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # the shared expert as wide as the routed ones, as in Qwen3.6-35B-A3B, so the kernels fold it in
    path = make_checkpoint(
        tmp_path_factory.mktemp("moe-triton"),
        kind="moe",
        seed=5,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention"] * 2,
        shared_expert_intermediate_size=32,
    )
    return path, load_reference(path)


@pytest.fixture
def triton_kernels(monkeypatch):
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls = {"gemv": 0, "pairs": 0}

    def gemv_plan(n: int, k: int) -> dict:
        calls["gemv"] += 1
        return {"BLOCK_N": 8, "BLOCK_K": 32}

    def get_plan(T, E, H, inter, top_k, dtype):
        calls["pairs"] += T <= 4
        return pairs_plan(True, H, inter) if T <= 4 else small_plan(16, "scatter", E, H, inter)

    monkeypatch.setattr(linear_op, "gemv_plan", gemv_plan)
    monkeypatch.setattr(triton_moe, "get_plan", get_plan)
    return calls


def test_prefill_then_decode_steps_match_transformers(checkpoint, triton_kernels):
    path, ref = checkpoint
    llm = LLM(str(path), device="cpu", dtype="float32", progress=False, max_model_len=128)
    ids = torch.randint(0, 500, (24,), generator=torch.Generator().manual_seed(3)).tolist()
    expected = ref(torch.tensor([ids])).logits[0]
    got = _score(llm, ids, [20, 1, 1, 1, 1])  # a prefill, then four single-token (decode-kernel) steps
    assert triton_kernels["gemv"] > 0 and triton_kernels["pairs"] > 0
    assert rel_err(got[:20], expected[:20]) < REL_TOL
    for pos in range(20, 24):
        assert rel_err(got[pos], expected[pos]) < REL_TOL, pos


def test_decode_attention_fused_qk_matches_transformers(checkpoint, triton_kernels, monkeypatch):
    """With the decode config's ``fused_qk`` the single-token steps' attention runs as one kernel (the q/k norm,
    RoPE and KV store inside the paged decode) and still matches transformers."""
    attn = importlib.import_module("hyserve.kernels.attention")
    qk = importlib.import_module("hyserve.kernels.attention.triton_decode_qk")
    config = attn._configs()["decode"]
    monkeypatch.setitem(config, "default", {**config["default"], "fused_qk": True})
    fused = []
    real = qk.paged_decode_qk
    monkeypatch.setattr(qk, "paged_decode_qk", lambda *a, **kw: fused.append(1) or real(*a, **kw))
    path, ref = checkpoint
    llm = LLM(str(path), device="cpu", dtype="float32", progress=False, max_model_len=128)
    ids = torch.randint(0, 500, (24,), generator=torch.Generator().manual_seed(8)).tolist()
    expected = ref(torch.tensor([ids])).logits[0]
    got = _score(llm, ids, [20, 1, 1, 1, 1])
    assert len(fused) == 4 * 2  # four single-token steps, two attention layers
    for pos in range(20, 24):
        assert rel_err(got[pos], expected[pos]) < REL_TOL, pos


@pytest.fixture(scope="module")
def wide_shared_checkpoint(tmp_path_factory):
    # the checkpoints' default shared expert, wider than the routed ones (48 against 32): plain torch adds it
    layers = dict(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    path = make_checkpoint(tmp_path_factory.mktemp("moe-wide-shared"), seed=11, **layers)
    return path, load_reference(path)


@pytest.mark.parametrize("shared", ["folded", "wider"])
def test_routed_projections_match_transformers(
    checkpoint, wide_shared_checkpoint, triton_kernels, monkeypatch, shared
):
    """With the router's rows in the mixers' projections (layers/routed_projection.py), the single-token steps
    route inside the out-projections (no router launch) and still match transformers; the prefill is untouched.
    A shared expert of another width than the routed ones takes the block's normed input too (it once took the
    raw one there)."""
    from hyserve.layers.routed_projection import prepare_routed_projections

    rp = importlib.import_module("hyserve.kernels.routed_projection")
    rp_triton = importlib.import_module("hyserve.kernels.routed_projection.triton_kernel")
    monkeypatch.setattr(rp, "gemv_plan", linear_op.gemv_plan)
    routed = []
    real = rp_triton.project_out_route_triton
    monkeypatch.setattr(rp_triton, "project_out_route_triton", lambda *a: routed.append(1) or real(*a))
    path, ref = checkpoint if shared == "folded" else wide_shared_checkpoint
    llm = LLM(str(path), device="cpu", dtype="float32", progress=False, max_model_len=128)
    assert prepare_routed_projections(llm.engine.model) > 0
    ids = torch.randint(0, 500, (24,), generator=torch.Generator().manual_seed(4)).tolist()
    expected = ref(torch.tensor([ids])).logits[0]
    got = _score(llm, ids, [20, 1, 1, 1, 1])
    # four single-token steps, each through every MoE layer
    assert len(routed) == 4 * llm.engine.config.num_hidden_layers
    assert rel_err(got[:20], expected[:20]) < REL_TOL
    for pos in range(20, 24):
        assert rel_err(got[pos], expected[pos]) < REL_TOL, pos


def test_prefill_sampled_rows_match_transformers(checkpoint, triton_kernels):
    """A prefill that samples one row of each of two prompts: the earlier layers' MoE runs at all 27 tokens
    (the grouped kernels), the last layer's at the 2 sampled rows only (the pairs kernel)."""
    path, ref = checkpoint
    llm = LLM(str(path), device="cpu", dtype="float32", progress=False, max_model_len=128)
    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in (20, 7)]
    got = last_rows_forward(llm, prompts, [True, True])
    assert got.shape[0] == 2 and triton_kernels["pairs"] > 0
    for row, p in zip(got, prompts):
        assert rel_err(row, ref(torch.tensor([p])).logits[0, -1]) < REL_TOL
