"""``layers/mma_projections.py``: the one-token steps' routed in-projections and routing out-projections take their
fragment-ordered 12-bit copies, with the pre-norm and the router's raw rows where the bf16 path has them. The tiny bf16 MoE checkpoint
through the Triton kernels (CPU interpreter); the CUDA kernel itself runs on the GPU only, so here its reference
(``gemv_mma_reference``, ``project_out_route_reference``, on the copies' unpacked values) stands in for it and the test checks the plumbing: which
weights get copies, which calls take them, and that the logits are the bf16 weights'."""

from __future__ import annotations

import argparse
import importlib

import pytest
import torch

from checkpoints import make_checkpoint
from hyserve import LLM
from hyserve.engine.args import add_engine_arguments, engine_args_from
from hyserve.kernels.mma_gemv import gemv_mma_reference, unpack_mma
from hyserve.kernels.routed_projection.reference import project_out_route_reference
from hyserve.kernels.testing import rel_err
from hyserve.layers.routed_projection import prepare_routed_projections
from test_model_triton_interpreter import triton_kernels  # noqa: F401 - the fixture
from test_model_vs_transformers import _score

linear_op = importlib.import_module("hyserve.kernels.linear")
rp = importlib.import_module("hyserve.kernels.routed_projection")
mma_layer = importlib.import_module("hyserve.layers.mma_projections")
mma_route = importlib.import_module("hyserve.kernels.routed_projection.mma_kernel")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(
        tmp_path_factory.mktemp("moe-mma"),
        kind="moe",
        seed=11,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        shared_expert_intermediate_size=32,
        num_experts=16,  # the in-projections with the router's rows fill 16-row tiles
    )


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the CPU interpreter's model test (see its fixture's module)"
)
def test_one_token_steps_take_the_copies(checkpoint, triton_kernels, monkeypatch):  # noqa: F811
    monkeypatch.setattr(rp, "gemv_plan", linear_op.gemv_plan)
    # the shapes here are too small for real plans: any plan lets the copies be made (the routing
    # out-projections [E + hidden, K] get one with a KSPLIT)
    plan, route_plan = {"SPLIT": 2}, {"SPLIT": 1, "KSPLIT": 1}
    experts_hidden = 16 + 64

    def plans(n, k):
        return route_plan if n == experts_hidden else plan

    monkeypatch.setattr(rp, "mma_plan", plans)
    monkeypatch.setattr(mma_layer, "mma_plan", plans)
    calls, route_calls = [], []

    def kernel(x, packed, p, *, norm_weight, norm_eps, raw_from):
        calls.append((tuple(x.shape), packed.shape, raw_from))
        assert p is plan and norm_weight is not None
        return gemv_mma_reference(x, packed, norm_weight, norm_eps, raw_from)

    monkeypatch.setattr(rp, "gemv_mma", kernel)

    def route(a, packed, residual, partial, top_k, p):
        route_calls.append((tuple(a.shape), packed.shape))
        assert p is route_plan
        return project_out_route_reference(a, unpack_mma(packed), residual, partial, top_k)

    monkeypatch.setattr(mma_route, "project_out_route_mma", route)
    llm = LLM(str(checkpoint), device="cpu", dtype="bfloat16", progress=False, max_model_len=32)
    assert prepare_routed_projections(llm.engine.model) > 0
    ids = torch.randint(0, 500, (7,), generator=torch.Generator().manual_seed(8)).tolist()
    plain = _score(llm, ids, [5, 1, 1]).float()
    assert mma_layer.prepare_mma_projections(llm.engine.model) > 0
    assert not calls
    copied = _score(llm, ids, [5, 1, 1]).float()
    experts = llm.engine.config.num_experts
    assert experts + llm.engine.config.hidden_size == experts_hidden
    layers = [layer.mlp.routed for layer in llm.engine.model.model.layers]
    # the DeltaNet layer's in_proj (264 rows here) does not fill 16-row tiles: it keeps the bf16 GEMV
    assert [r.w_in_mma is not None for r in layers] == [False, True] and layers[0].n_in % 16
    # two one-token steps through the attention layer's qkv, its router rows after its own
    assert len(calls) == 2
    assert all(shape[0] - raw == experts and x == (1, shape[1]) for x, shape, raw in calls)
    # the routing out-projections: the attention layer's o_proj [80, 128] (the DeltaNet's [80, 96] has no
    # 64-column steps), in both one-token steps
    assert [r.w_out_mma is not None for r in layers] == [False, True]
    assert route_calls == [((1, 128), (80, 128))] * 2
    assert rel_err(copied[:5], plain[:5]) == 0.0  # the prefill keeps the bf16 weights
    for pos in range(
        5, 7
    ):  # the normed x rounded to bf16 (as the unfused path does) where the GEMV keeps fp32
        assert rel_err(copied[pos], plain[pos]) < 1e-2, pos
        assert copied[pos].argmax() == plain[pos].argmax()


def test_flag():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_args_from(parser.parse_args([])).mma_projections
    assert not engine_args_from(parser.parse_args(["--no-mma-projections"])).mma_projections


def test_nothing_to_copy_in_other_dtypes(checkpoint):
    llm = LLM(str(checkpoint), device="cpu", dtype="float32", progress=False, max_model_len=32)
    prepare_routed_projections(llm.engine.model)
    assert mma_layer.prepare_mma_projections(llm.engine.model) == 0


def test_expert_copies(tmp_path):
    """``--mma-experts``: every MoE block gets its experts' gate_up and down copies (the shared expert last),
    bit-exact; the flag turns it on."""
    from hyserve.kernels.moe.mma_experts import unpack_mma_down, unpack_mma_experts

    path = make_checkpoint(
        tmp_path, kind="moe", seed=3, num_hidden_layers=1, layer_types=["full_attention"], moe_intermediate_size=64,
        shared_expert_intermediate_size=64, num_experts=16,
    )  # fmt: skip
    llm = LLM(str(path), device="cpu", dtype="bfloat16", progress=False, max_model_len=32)
    assert mma_layer.prepare_mma_experts(llm.engine.model) > 0
    moe = llm.engine.model.model.layers[0].mlp
    w, shared = unpack_mma_experts(moe.packed)
    wd, sd = unpack_mma_down(moe.packed)
    for got, want in [
        (w, moe.experts.gate_up_proj),
        (shared, moe.shared_expert.gate_up_proj.weight),
        (wd, moe.experts.down_proj),
        (sd, moe.shared_expert.down_proj.weight),
    ]:
        assert torch.equal(got.view(torch.int16), want.data.view(torch.int16))
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert not engine_args_from(parser.parse_args([])).mma_experts
    assert engine_args_from(parser.parse_args(["--mma-experts"])).mma_experts
