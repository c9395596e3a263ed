"""The accuracy gate: the engine against transformers' own implementation, on the same weights.

Transformers' model is built on the meta device and its parameters are made views of the engine's, so
the check costs no second copy of the weights (the 35B model fits once on an H200, not twice). Both run
the same random prompts: teacher-forced logits (relative error, per-position KL, top-1 agreement) and
greedy continuations (how many tokens match; a divergence is accepted only at a near tie of the
reference's top two logits).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from hyserve.engine.args import engine_args_from
from hyserve.engine.llm_engine import LLMEngine
from hyserve.engine.sampling_params import SamplingParams
from hyserve.engine.scheduler import ScheduledSequence, SchedulerOutput
from hyserve.engine.sequence import Sequence
from hyserve.kernels import use_reference

log = logging.getLogger(__name__)

# Tolerances per compute dtype: (relative logit error, mean KL, top-1 agreement, near-tie logit margin)
TOLERANCES = {
    torch.float32: (1e-4, 1e-6, 1.0, 1e-3),
    torch.bfloat16: (0.08, 0.02, 0.95, 0.5),
    torch.float16: (0.03, 0.005, 0.97, 0.2),
}


@dataclass
class VerifyReport:
    dtype: str
    path: str  # which engine path: "fast" (dispatching ops) or "reference" (plain-torch ops)
    prompt_lens: list[int]
    rel_logit_error: float  # ||ours - ref|| / ||ref|| over all positions of all prompts
    max_abs_logit_error: float
    kl_mean: float  # mean over positions of KL(ref || ours), nats
    kl_max: float
    top1_agreement: float  # fraction of positions whose argmax agrees
    greedy_match: list[int]  # per prompt: leading generated tokens identical to the reference's
    greedy_tokens: int
    greedy_ok: bool  # every divergence happened at a near tie of the reference
    passed: bool
    seconds: float


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("verify")
    g.add_argument("--prompt-lens", default=None, help="comma-separated prompt lengths (default by device)")
    g.add_argument("--greedy-tokens", type=int, default=32, help="greedy tokens compared per prompt")
    g.add_argument("--paths", default="fast,reference", help="engine paths to check: fast, reference")
    g.add_argument("--json", default=None, help="write the reports to this file")


def _hf_name_map(config) -> dict[str, tuple[str, slice | None, bool]]:
    """HF parameter name -> (our name, row slice of it, needs an inserted dim 1)."""
    mapping: dict[str, tuple[str, slice | None, bool]] = {}
    for i, kind in enumerate(config.layer_types):
        pre = f"model.layers.{i}."
        if kind == "linear_attention":
            mapping[pre + "linear_attn.conv1d.weight"] = (pre + "linear_attn.conv1d.weight", None, True)
        if config.is_moe:
            inter, mlp = config.shared_expert_intermediate_size, pre + "mlp.shared_expert."
        else:
            inter, mlp = config.intermediate_size, pre + "mlp."
        mapping[mlp + "gate_proj.weight"] = (mlp + "gate_up_proj.weight", slice(0, inter), False)
        mapping[mlp + "up_proj.weight"] = (mlp + "gate_up_proj.weight", slice(inter, 2 * inter), False)
    return mapping


def build_reference(engine: LLMEngine) -> nn.Module:
    """Transformers' text model whose parameters are views of the engine's."""
    import transformers as tf

    config = engine.config
    raw = json.loads((Path(engine.args.model) / "config.json").read_text())
    text = dict(raw.get("text_config") or raw)
    text.pop("model_type", None)
    text.pop("architectures", None)
    if config.is_moe:
        hf_config, cls = tf.Qwen3_5MoeTextConfig(**text), tf.Qwen3_5MoeForCausalLM
    else:
        hf_config, cls = tf.Qwen3_5TextConfig(**text), tf.Qwen3_5ForCausalLM
    hf_config._attn_implementation = "sdpa"
    with torch.device("meta"):
        ref = cls(hf_config)
    ours = dict(engine.model.named_parameters())
    ours["lm_head.weight"] = engine.model.lm_head.weight
    mapping = _hf_name_map(config)
    for name, param in list(ref.named_parameters()):
        our_name, rows, unsqueeze = mapping.get(name, (name, None, False))
        tensor = ours[our_name]
        if rows is not None:
            tensor = tensor[rows]
        if unsqueeze:
            tensor = tensor.unsqueeze(1)
        if tuple(tensor.shape) != tuple(param.shape):
            raise RuntimeError(
                f"{name}: transformers wants {list(param.shape)}, engine has {list(tensor.shape)}"
            )
        owner, _, attr = name.rpartition(".")
        ref.get_submodule(owner)._parameters[attr] = nn.Parameter(tensor, requires_grad=False)
    rotary = type(ref.model.rotary_emb)(config=hf_config)
    ref.model.rotary_emb = rotary.to(engine.device)
    return ref.eval()


def _engine_logits(engine: LLMEngine, prompts: list[list[int]]) -> list[torch.Tensor]:
    seqs = [Sequence(f"verify-{i}", p, SamplingParams()) for i, p in enumerate(prompts)]
    for seq in seqs:
        engine.cache_manager.allocate(seq, seq.num_tokens)
    out = SchedulerOutput([ScheduledSequence(s, s.num_tokens, sample=False) for s in seqs])
    try:
        return engine.runner.score(out)
    finally:
        for seq in seqs:
            engine.cache_manager.free(seq)


@torch.inference_mode()
def _reference_greedy(ref: nn.Module, prompt: list[int], n: int, device) -> tuple[list[int], list[float]]:
    """Greedy tokens and, per step, the reference's margin between its best logit and our choice's."""
    out = ref.generate(
        torch.tensor([prompt], device=device),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences[0, len(prompt) :].tolist(), [step[0].float() for step in out.logits]


def compare(
    engine: LLMEngine, ref: nn.Module, prompts: list[list[int]], greedy_tokens: int, path: str
) -> VerifyReport:
    start = time.perf_counter()
    rel_tol, kl_tol, top1_tol, tie_margin = TOLERANCES[engine.dtype]
    with use_reference(path == "reference"):
        ours = _engine_logits(engine, prompts)
        params = SamplingParams(temperature=0.0, max_tokens=greedy_tokens, ignore_eos=True)
        rid = f"verify-{path}-"
        for i, p in enumerate(prompts):
            engine.add_request(rid + str(i), p, params)
        generated: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    generated[o.request_id] = o.outputs[0].token_ids
    diff_sq = ref_sq = 0.0
    max_abs = 0.0
    kls, agree = [], []
    with torch.inference_mode():
        for prompt, mine in zip(prompts, ours):
            theirs = ref(torch.tensor([prompt], device=engine.device)).logits[0].float()
            diff_sq += (mine - theirs).pow(2).sum().item()
            ref_sq += theirs.pow(2).sum().item()
            max_abs = max(max_abs, (mine - theirs).abs().max().item())
            logp_ref, logp_ours = theirs.log_softmax(-1), mine.log_softmax(-1)
            kls.append((logp_ref.exp() * (logp_ref - logp_ours)).sum(-1))
            agree.append((mine.argmax(-1) == theirs.argmax(-1)).float())
    kl = torch.cat(kls)
    matches, greedy_ok = [], True
    for i, prompt in enumerate(prompts):
        expected, ref_logits = _reference_greedy(ref, prompt, greedy_tokens, engine.device)
        mine = generated[rid + str(i)]
        n = next((j for j, (a, b) in enumerate(zip(mine, expected)) if a != b), min(len(mine), len(expected)))
        matches.append(n)
        if n < greedy_tokens:
            step = ref_logits[n]
            margin = (step.max() - step[mine[n]]).item()
            if margin > tie_margin:
                greedy_ok = False
                log.warning(
                    "prompt %d: greedy diverges at token %d with a reference margin %.3g", i, n, margin
                )
    rel = (diff_sq / ref_sq) ** 0.5
    top1 = torch.cat(agree).mean().item()
    passed = rel <= rel_tol and kl.mean().item() <= kl_tol and top1 >= top1_tol and greedy_ok
    return VerifyReport(
        dtype=str(engine.dtype).replace("torch.", ""),
        path=path,
        prompt_lens=[len(p) for p in prompts],
        rel_logit_error=rel,
        max_abs_logit_error=max_abs,
        kl_mean=kl.mean().item(),
        kl_max=kl.max().item(),
        top1_agreement=top1,
        greedy_match=matches,
        greedy_tokens=greedy_tokens,
        greedy_ok=greedy_ok,
        passed=passed,
        seconds=time.perf_counter() - start,
    )


def run_verify(ns: argparse.Namespace) -> int:
    args = engine_args_from(ns)
    engine = LLMEngine(args)
    if ns.prompt_lens:
        lens = [int(x) for x in ns.prompt_lens.split(",")]
    else:
        lens = [16, 100, 300, 1000] if engine.device.type == "cuda" else [5, 33, 70]
    gen = torch.Generator().manual_seed(ns.seed)
    high = min(engine.config.vocab_size, 248044)
    prompts = [torch.randint(0, high, (n,), generator=gen).tolist() for n in lens]
    ref = build_reference(engine)
    reports = []
    for path in [p.strip() for p in ns.paths.split(",") if p.strip()]:
        if path not in ("fast", "reference"):
            raise ValueError(f"--paths takes fast and/or reference, got {path!r}")
        report = compare(engine, ref, prompts, ns.greedy_tokens, path)
        reports.append(report)
        print(_format(report), flush=True)
    if ns.json:
        Path(ns.json).write_text(json.dumps([asdict(r) for r in reports], indent=2))
    return 0 if all(r.passed for r in reports) else 1


def _format(r: VerifyReport) -> str:
    rel_tol, kl_tol, top1_tol, _ = TOLERANCES[getattr(torch, r.dtype)]
    return "\n".join(
        [
            f"verify [{r.path} path, {r.dtype}] prompts {r.prompt_lens}: {'PASS' if r.passed else 'FAIL'}",
            f"  teacher-forced logits: rel error {r.rel_logit_error:.3e} (tol {rel_tol:g}), "
            f"max abs {r.max_abs_logit_error:.3e}",
            f"  per-position KL(ref||ours): mean {r.kl_mean:.3e} (tol {kl_tol:g}), max {r.kl_max:.3e}",
            f"  top-1 agreement {r.top1_agreement:.4f} (tol {top1_tol:g})",
            f"  greedy match {r.greedy_match} of {r.greedy_tokens} tokens; divergences at near ties only: "
            f"{r.greedy_ok}",
            f"  {r.seconds:.1f} s",
        ]
    )
