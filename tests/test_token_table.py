"""``--token-table`` (layers/token_table.py): the first layer's in-projection gathered by token id. Each test
poisons that projection's weight with NaN once the table is built, so a step that still read it could not match.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from checkpoints import load_reference, make_checkpoint
from hyserve import LLM, SamplingParams
from hyserve.kernels.testing import rel_err
from hyserve.layers.routed_projection import mixer_projections, prepare_routed_projections
from hyserve.layers.token_table import prepare_token_table
from test_model_triton_interpreter import REL_TOL, triton_kernels  # noqa: F401 - the fixture
from test_model_vs_transformers import _score

linear_op = importlib.import_module("hyserve.kernels.linear")
rp = importlib.import_module("hyserve.kernels.routed_projection")


@pytest.fixture(scope="module", params=["moe", "dense"])
def checkpoint(request, tmp_path_factory):
    path = make_checkpoint(
        tmp_path_factory.mktemp(f"table-{request.param}"),
        kind=request.param,
        seed=11,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention"] * 2,
    )
    return path, load_reference(path)


def _engine(path, **kw) -> LLM:
    return LLM(str(path), device="cpu", dtype="float32", progress=False, max_model_len=128, **kw)


def _poison_first_projection(llm: LLM) -> None:
    in_proj, _ = mixer_projections(llm.engine.model.model.layers[0])
    in_proj.weight.data.fill_(float("nan"))


def test_steps_match_transformers_without_the_weight(checkpoint):
    """A prefill in two chunks, then single-token steps (the reference ops on the CPU): the logits match
    transformers and the plain engine's, with the first projection's weight unreadable."""
    path, ref = checkpoint
    ids = torch.randint(0, 500, (24,), generator=torch.Generator().manual_seed(2)).tolist()
    chunks = [13, 7, 1, 1, 1, 1]
    plain = _score(_engine(path), ids, chunks)
    llm = _engine(path, token_table=True)
    _poison_first_projection(llm)
    got = _score(llm, ids, chunks)
    assert torch.isfinite(got).all()
    assert rel_err(got, ref(torch.tensor([ids])).logits[0]) < REL_TOL
    assert rel_err(got, plain) < 1e-5  # the same values, up to the order of the fp32 sums


def test_generation_takes_the_same_tokens(checkpoint):
    """Batched greedy generation through the scheduler (prefills of several prompts, then decode batches)."""
    path, _ = checkpoint
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in (9, 30, 4)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in _engine(path).generate(prompts, params)]
    llm = _engine(path, token_table=True)
    _poison_first_projection(llm)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == plain


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_steps_match_the_plain_engine(checkpoint):
    """bf16 on the GPU, CUDA graphs captured (the decode steps replay them): teacher-forced logits within bf16
    rounding of the plain engine's, and the same greedy tokens through the scheduler."""
    path, _ = checkpoint
    kw = dict(device="cuda", dtype="bfloat16", progress=False, max_model_len=128, cuda_graph_sizes=[1, 2, 4])
    kw.update(max_num_seqs=4, kv_cache_memory_gb=1)
    ids = torch.randint(0, 500, (24,), generator=torch.Generator().manual_seed(2)).tolist()
    prompts = [ids[:9], ids]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    plain_llm = LLM(str(path), **kw)
    plain = _score(plain_llm, ids, [20, 1, 1, 1, 1]).float()
    plain_tokens = [o.outputs[0].token_ids for o in plain_llm.generate(prompts, params)]
    del plain_llm
    llm = LLM(str(path), token_table=True, **kw)
    _poison_first_projection(llm)
    got = _score(llm, ids, [20, 1, 1, 1, 1]).float()
    assert torch.isfinite(got).all() and rel_err(got, plain) < 2e-2
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == plain_tokens


def test_table_size_and_one_table_a_model(checkpoint):
    path, _ = checkpoint
    llm = _engine(path)
    config = llm.engine.config
    in_proj, _ = mixer_projections(llm.engine.model.model.layers[0])
    assert prepare_token_table(llm.engine.model) == config.vocab_size * in_proj.out_features * 4
    with pytest.raises(ValueError, match="already"):
        prepare_token_table(llm.engine.model)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the CPU interpreter's model test (see its fixture's module)"
)
def test_routed_projections_take_the_router_rows_from_the_table(checkpoint, triton_kernels, monkeypatch):  # noqa: F811
    """With the routed projections (as on the GPU) the table also holds the first layer's router rows: the
    single-token steps route from them (the in-projection's whole weight, router rows included, poisoned)."""
    path, ref = checkpoint
    if "moe" not in str(path):
        pytest.skip("the routed projections are the MoE layers'")
    monkeypatch.setattr(rp, "gemv_plan", linear_op.gemv_plan)
    rp_triton = importlib.import_module("hyserve.kernels.routed_projection.triton_kernel")
    routed = []
    real = rp_triton.project_out_route_triton
    monkeypatch.setattr(rp_triton, "project_out_route_triton", lambda *a: routed.append(1) or real(*a))
    llm = _engine(path)
    model = llm.engine.model
    assert prepare_routed_projections(model) > 0
    first = model.model.layers[0].mlp.routed
    assert prepare_token_table(model) == llm.engine.config.vocab_size * first.w_in.shape[0] * 4
    first.w_in.fill_(float("nan"))
    ids = torch.randint(0, 500, (24,), generator=torch.Generator().manual_seed(4)).tolist()
    got = _score(llm, ids, [20, 1, 1, 1, 1])
    assert len(routed) == 4 * 4  # four single-token steps, four MoE layers
    expected = ref(torch.tensor([ids])).logits[0]
    assert rel_err(got[:20], expected[:20]) < REL_TOL
    for pos in range(20, 24):
        assert rel_err(got[pos], expected[pos]) < REL_TOL, pos


def test_flag():
    import argparse

    from hyserve.engine.args import add_engine_arguments, engine_args_from

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert not engine_args_from(parser.parse_args([])).token_table
    assert engine_args_from(parser.parse_args(["--token-table"])).token_table
