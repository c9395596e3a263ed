"""Checkpoint loading: layouts, sharding, skipped tensors, and clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoints import make_checkpoint
from hyserve.config import ModelConfig
from hyserve.model.loader import build_model, checkpoint_views


def _load(path, load_format="auto"):
    return build_model(
        ModelConfig.from_pretrained(path), path, "cpu", torch.float32, load_format, progress=False
    )


def test_every_layout_loads_the_same_weights(tmp_path):
    fused = _load(make_checkpoint(tmp_path / "fused", expert_layout="fused", seed=3))
    split = _load(make_checkpoint(tmp_path / "split", expert_layout="per_expert", seed=3))
    a, b = (dict(m.named_parameters()) for m in (fused, split))
    for name, t in a.items():
        assert torch.equal(t, b[name]), name


def test_multimodal_checkpoint_text_tensors_land_where_they_belong(tmp_path):
    path = make_checkpoint(tmp_path / "multi", multimodal=True, expert_layout="fused", seed=3)
    views = checkpoint_views(_load(path))
    file = load_file(path / "model.safetensors")
    text = {k.replace("model.language_model.", "model."): t for k, t in file.items() if "visual" not in k}
    assert set(text) == set(views)
    for k, t in text.items():
        assert torch.equal(views[k].reshape(t.shape), t), k


def test_sharded_checkpoint_with_index_and_skipped_tensors(tmp_path):
    path = make_checkpoint(tmp_path / "one", expert_layout="fused", seed=4)
    whole = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    keys = sorted(whole)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    weight_map = {}
    for name, ks in shards.items():
        extra = {"mtp.fc.weight": torch.zeros(2, 2)} if name.startswith("model-00002") else {}
        save_file({k: whole[k] for k in ks} | extra, path / name)
        weight_map.update({k: name for k in ks} | {k: name for k in extra})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    model = _load(path)
    views = checkpoint_views(model)
    for k, t in whole.items():
        assert torch.equal(views[k].reshape(t.shape), t), k


def test_missing_tensor_is_named(tmp_path):
    path = make_checkpoint(tmp_path / "m", seed=5)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.linear_attn.A_log"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.linear_attn\.A_log"):
        _load(path)


def test_misshaped_tensor_reports_both_shapes(tmp_path):
    path = make_checkpoint(tmp_path / "s", seed=6)
    tensors = load_file(path / "model.safetensors")
    tensors["model.norm.weight"] = torch.zeros(7)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape \[7\].*expects \[64\]"):
        _load(path)


def test_unsupported_architecture_is_a_clear_error():
    with pytest.raises(ValueError, match="qwen3_5_moe.*qwen3_5"):
        ModelConfig.from_dict({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})


def test_config_reads_flat_and_multimodal_alike(tmp_path):
    flat = ModelConfig.from_pretrained(make_checkpoint(tmp_path / "f", seed=1))
    multi = ModelConfig.from_pretrained(make_checkpoint(tmp_path / "mm", multimodal=True, seed=1))
    assert flat.layer_types == multi.layer_types and flat.num_experts == multi.num_experts == 8
    with pytest.raises(ValueError, match="layer_types"):
        ModelConfig.from_dict(
            json.loads((tmp_path / "f" / "config.json").read_text()) | {"layer_types": ["x"]}
        )


def test_dummy_weights_are_seeded_finite_and_spread_the_router(tmp_path):
    path = make_checkpoint(tmp_path / "d", seed=2, num_experts=16, num_experts_per_tok=2)
    a, b = _load(path, "dummy"), _load(path, "dummy")
    for (name, t), (_, u) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(t, u), name
        assert torch.isfinite(t).all(), name
    x = torch.randn(256, 64)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))
    router = a.model.layers[0].mlp.gate.weight
    chosen = torch.topk(x @ router.t(), 2, dim=-1).indices.unique()
    assert chosen.numel() == 16, "random tokens should reach every expert"
