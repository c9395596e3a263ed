"""``--mma-experts-only`` on the CPU: releasing the experts' bf16 weights keeps their shapes in zero bytes, the
copies give every bit back (what ``hyserve verify`` hands transformers), every plan maps onto the grouped 12-bit
kernels' block sizes, and what cannot run without the bf16 weights (the CPU, the reference path) says so. The
kernels over the copies run on the GPU only (``kernels/moe/test_mma_grouped.py``)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch

from checkpoints import make_checkpoint
from hyserve import LLM, SamplingParams
from hyserve.cli import main
from hyserve.engine.args import add_engine_arguments, engine_args_from
from hyserve.engine.llm_engine import EngineArgs, LLMEngine, experts_only
from hyserve.kernels.moe.configs import get_plan
from hyserve.kernels.moe.triton_moe import COPIES_BLOCK_MS, _copies_plan
from hyserve.layers.mma_projections import (
    prepare_mma_experts,
    released_expert_nbytes,
    released_expert_weights,
)
from hyserve.model.loader import checkpoint_views
from hyserve.verify import UNPACK_HEADROOM, require_room


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # widths the grouped 12-bit kernels take (H and I multiples of 128), a shared expert as wide as the routed ones
    return make_checkpoint(
        tmp_path_factory.mktemp("moe-only"),
        kind="moe",
        seed=5,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        hidden_size=128,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        num_experts=8,
    )


def test_release_keeps_the_shapes_in_zero_bytes_and_the_bits_in_the_copies(checkpoint):
    llm = LLM(str(checkpoint), device="cpu", dtype="bfloat16", progress=False, max_model_len=32)
    model = llm.engine.model
    before = {k: v.clone() for k, v in checkpoint_views(model).items() if ".mlp.experts." in k}
    assert len(before) == 4  # gate_up_proj and down_proj of two layers
    assert prepare_mma_experts(model, release=True) > 0
    for layer in model.model.layers:
        moe = layer.mlp
        assert moe.packed.released
        for param in (moe.experts.gate_up_proj, moe.experts.down_proj):
            assert param.untyped_storage().nbytes() <= 2 and param.dtype == torch.bfloat16
        assert moe.experts.gate_up_proj.shape == (8, 256, 128) and moe.experts.down_proj.shape == (
            8,
            128,
            128,
        )
    unpacked = released_expert_weights(model)
    assert unpacked.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(unpacked[key].view(torch.int16), value.view(torch.int16)), key
    assert (
        released_expert_nbytes(model)
        == sum(v.numel() * 2 for v in unpacked.values())
        == 2 * 2 * 8 * 3 * 128 * 128
    )


def test_verify_says_when_the_unpacked_experts_cannot_fit():
    # an H100 beside the whole 35B model with the copies alone: ~24 GB spare for 64.4 GB of experts
    with pytest.raises(ValueError, match=r"needs the released experts' bf16 weights back \(60.0 GiB"):
        require_room(60 << 30, 24 << 30)
    with pytest.raises(ValueError, match="GiB to run"):
        require_room(60 << 30, (60 << 30) + UNPACK_HEADROOM - 1)
    require_room(60 << 30, (60 << 30) + UNPACK_HEADROOM)  # an H200: fits
    require_room(60 << 30, None)  # the CPU: unbounded


def test_a_released_block_refuses_the_cpu_and_the_reference_path(checkpoint):
    llm = LLM(str(checkpoint), device="cpu", dtype="bfloat16", progress=False, max_model_len=32)
    prepare_mma_experts(llm.engine.model, release=True)
    with pytest.raises(ValueError, match="--mma-experts-only"):
        llm.generate([[1, 2, 3]])


def test_every_plan_maps_onto_the_copies_block_sizes():
    # Qwen3.6-35B-A3B's expert shapes, at token counts across the plan table's buckets
    plans = {
        T: get_plan(T, 256, 2048, 512, 8, torch.bfloat16) for T in (1, 3, 8, 20, 100, 600, 1024, 2048, 9000)
    }
    for T, plan in plans.items():
        copies = _copies_plan(plan)
        assert copies["block_m"] in COPIES_BLOCK_MS and copies["down_mode"] == "scatter", T
        if plan["down_mode"] == "pairs":  # the pairs plans' fused router only takes the top-k
            assert not copies["fused_router"]
        if 16 <= plan["block_m"] <= 64:
            assert copies["block_m"] == plan["block_m"]
    assert _copies_plan(plans[1])["block_m"] == 16 and _copies_plan(plans[9000])["block_m"] == 64


def _args(*flags: str) -> EngineArgs:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return engine_args_from(parser.parse_args(["--model", "m", *flags]))


def test_the_flag_implies_the_copies():
    args = _args("--mma-experts-only")
    assert args.mma_experts and args.mma_experts_only
    assert not _args("--mma-experts").mma_experts_only


@pytest.mark.parametrize(
    "flags,device,dtype,moe,only",
    [
        ((), "cuda", torch.bfloat16, True, True),  # the default on the GPU: the copies alone
        ((), "cpu", torch.bfloat16, True, False),  # the copies' kernels run on CUDA only
        ((), "cuda", torch.float32, True, False),  # ... and copy bf16 weights only
        ((), "cuda", torch.bfloat16, False, False),  # a dense checkpoint has no experts
        (
            ("--mma-experts",),
            "cuda",
            torch.bfloat16,
            True,
            False,
        ),  # the copies beside the bf16 experts, as asked
        (("--no-mma-experts-only",), "cuda", torch.bfloat16, True, False),
        (("--mma-experts-only",), "cuda", torch.bfloat16, True, True),
    ],
)
def test_the_copies_alone_are_the_default_for_moe_on_cuda(flags, device, dtype, moe, only):
    config = SimpleNamespace(is_moe=moe)
    assert experts_only(_args(*flags), torch.device(device), dtype, config) is only


def test_the_engine_resolves_the_default_on_the_cpu(checkpoint):
    llm = LLM(str(checkpoint), device="cpu", progress=False, max_model_len=32)
    assert llm.engine.args.mma_experts_only is False and not llm.engine.args.mma_experts


def test_the_engine_refuses_the_flag_on_the_cpu_before_loading(tmp_path):
    # no checkpoint at all in the folder: the error comes before anything is read
    with pytest.raises(ValueError, match="CUDA only"):
        LLMEngine(EngineArgs(model=str(tmp_path), device="cpu", mma_experts_only=True))


def test_verify_refuses_the_reference_path_before_loading(tmp_path, capsys):
    args = ["verify", "--model", str(tmp_path), "--mma-experts-only", "--paths", "fast,reference"]
    assert main(args) != 0
    assert "--paths reference needs the experts' bf16 weights" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the copies' kernels run on CUDA only")
def test_the_default_on_cuda_serves_from_the_copies_alone(checkpoint):
    """With no expert flag a bf16 MoE checkpoint on CUDA releases its experts, and its teacher-forced logprobs stay
    with the bf16 experts' (``--no-mma-experts-only``); the engine at its defaults, CUDA graphs included."""
    kw = dict(device="cuda", progress=False, max_model_len=128, max_num_seqs=2, kv_cache_memory_gb=0.05)
    prompt = torch.randint(0, 512, (60,), generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    logprobs = {}
    for name, extra in (("copies", {}), ("bf16", {"mma_experts_only": False})):
        llm = LLM(str(checkpoint), **kw, **extra)
        copies = [getattr(layer.mlp, "packed", None) is not None for layer in llm.engine.model.model.layers]
        assert llm.engine.args.mma_experts_only is (name == "copies")
        assert copies == [name == "copies"] * 2
        if name == "copies":
            assert all(layer.mlp.packed.released for layer in llm.engine.model.model.layers)
        out = llm.generate([prompt], params)[0]
        logprobs[name] = torch.tensor([lp[0] for lp in out.prompt_logprobs[1:]])
        del llm
        torch.cuda.empty_cache()
    assert torch.isfinite(logprobs["copies"]).all()
    assert (logprobs["copies"] - logprobs["bf16"]).abs().max() < 0.05
