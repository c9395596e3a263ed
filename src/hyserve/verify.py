"""The accuracy gate: the engine against transformers' own implementation, on the same weights.

Transformers' model is built on the meta device and its parameters are made views of the engine's, so
the check costs no second copy of the weights (the 35B model fits once on an H200, not twice); only experts whose
bf16 weights the engine released (``--mma-experts-only``, the default on CUDA) are unpacked from their 12-bit copies
into new tensors (~64.4 GB for the whole 35B model: beside the engine's ~54 GB, an H200's memory). Both run
the same random prompts: teacher-forced logits (relative error, per-position KL, top-1 agreement) and
greedy continuations (how many tokens match; a divergence is accepted only at a near tie of the
reference's top two logits).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn

from hyserve.engine.args import engine_args_from
from hyserve.engine.llm_engine import LLMEngine
from hyserve.engine.sampling_params import SamplingParams
from hyserve.engine.scheduler import ScheduledSequence, SchedulerOutput
from hyserve.engine.sequence import Sequence
from hyserve.kernels import use_reference
from hyserve.model.loader import checkpoint_views

log = logging.getLogger(__name__)
SOLO_DECODE_STEPS = 8  # steps the first prompt decodes alone before the others arrive
# what transformers' model needs beside the unpacked experts: the unpack's temporaries (~2 GB), one decoder layer
# upcast to fp32 for the truth (~3.3 GB for Qwen3.6-35B-A3B) and activations
UNPACK_HEADROOM = 6 << 30

# fp32 engines must match the fp32 reference to these absolute bounds.
FP32_TOLERANCE = {"rel": 1e-4, "kl": 1e-6, "top1": 1.0}
# Lower precision: the engine's error against the fp32 truth may exceed transformers' own error in the same
# dtype by at most this factor plus slack (both start from the same bf16 weights).
LOW_PRECISION_FACTOR = {"rel": 1.25, "kl": 1.5}
LOW_PRECISION_SLACK = {"rel": 0.01, "kl": 1e-4, "top1": 0.02}


@dataclass
class Agreement:
    rel_logit_error: float  # ||x - truth|| / ||truth|| over all positions of all prompts
    rms_abs_error: float  # root-mean-square logit difference
    kl_mean: float  # mean over positions of KL(truth || x), nats
    kl_max: float
    top1_agreement: float  # fraction of positions whose argmax agrees with the truth


@dataclass
class VerifyReport:
    dtype: str
    path: str  # which engine path: "fast" (dispatching ops) or "reference" (plain-torch ops)
    prompt_lens: list[int]
    engine: Agreement  # the engine against the fp32 truth, the prompts scored in one step (paged attention)
    engine_alone: Agreement  # the same, each prompt scored alone (causal_attention over its own rows)
    transformers: Agreement  # transformers in the engine's dtype against the fp32 truth
    greedy_match: list[int]  # per prompt: leading greedy tokens identical to transformers' (same dtype)
    greedy_tokens: int
    greedy_ok: bool  # every divergence happened where transformers' top logits were within its own noise
    passed: bool
    seconds: float


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("verify")
    g.add_argument("--prompt-lens", default=None, help="comma-separated prompt lengths (default by device)")
    g.add_argument("--greedy-tokens", type=int, default=32, help="greedy tokens compared per prompt")
    g.add_argument("--paths", default="fast,reference", help="engine paths to check: fast, reference")
    g.add_argument("--json", default=None, help="write the reports to this file")


def spare_bytes(device: torch.device) -> int | None:
    """Memory the device can still hand out beside the engine (the driver's free memory plus what torch's
    allocator holds unused), None where unbounded (the CPU)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def require_room(need: int, spare: int | None) -> None:
    """Fail before unpacking, not 30 s in with an out-of-memory deep in the unpack, when transformers' model cannot
    get the released experts' bf16 weights back beside the engine (``--mma-experts-only``: the whole
    Qwen3.6-35B-A3B needs ~54 + 64.4 GB, an H200's memory, not an H100's)."""
    if spare is not None and need + UNPACK_HEADROOM > spare:
        gib = 1 << 30
        raise ValueError(
            f"hyserve verify: transformers' model needs the released experts' bf16 weights back ({need / gib:.1f} "
            f"GiB, unpacked from their 12-bit copies) plus ~{UNPACK_HEADROOM / gib:.0f} GiB to run, but the device "
            f"has {spare / gib:.1f} GiB spare beside the engine. Verify on a device with more memory, or a model "
            "of fewer layers (scripts/device/verify_depth.sh builds one)"
        )


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
    ours = checkpoint_views(engine.model)
    if engine.args.mma_experts_only:  # the released experts, unpacked from their copies into new bf16 tensors
        from hyserve.layers.mma_projections import released_expert_nbytes, released_expert_weights

        require_room(released_expert_nbytes(engine.model), spare_bytes(engine.device))
        ours.update(released_expert_weights(engine.model))
    for name, param in list(ref.named_parameters()):
        tensor = ours[name]
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


class _Upcast:
    """Run transformers' model in fp32 one decoder layer at a time: each layer's weights are upcast just
    before it runs and dropped after, so the fp32 truth of a 35B model needs ~3 GB extra, not 140 GB."""

    def __init__(self, ref: nn.Module) -> None:
        self.ref = ref
        self.saved: dict[nn.Module, dict[str, nn.Parameter]] = {}
        self.handles: list = []

    def _swap(self, module: nn.Module, *_args) -> None:
        saved = {}
        for name, param in list(module.named_parameters()):
            owner, _, attr = name.rpartition(".")
            sub = module.get_submodule(owner)
            saved[name] = param
            sub._parameters[attr] = nn.Parameter(param.detach().float(), requires_grad=False)
        self.saved[module] = saved

    def _restore(self, module: nn.Module, *_args) -> None:
        for name, param in self.saved.pop(module).items():
            owner, _, attr = name.rpartition(".")
            module.get_submodule(owner)._parameters[attr] = param

    def __enter__(self) -> nn.Module:
        whole = [self.ref.model.embed_tokens, self.ref.model.norm, self.ref.lm_head]
        for m in whole:
            self._swap(m)
        for layer in self.ref.model.layers:
            self.handles.append(layer.register_forward_pre_hook(self._swap))
            self.handles.append(layer.register_forward_hook(self._restore))
        return self.ref

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
        for m in list(self.saved):
            self._restore(m)


def _agreement(xs: list[torch.Tensor], truths: list[torch.Tensor]) -> Agreement:
    diff_sq = ref_sq = 0.0
    count = 0
    kls, agree = [], []
    for x, t in zip(xs, truths):
        diff_sq += (x - t).pow(2).sum().item()
        ref_sq += t.pow(2).sum().item()
        count += t.numel()
        logp_t, logp_x = t.log_softmax(-1), x.log_softmax(-1)
        kls.append((logp_t.exp() * (logp_t - logp_x)).sum(-1))
        agree.append((x.argmax(-1) == t.argmax(-1)).float())
    kl = torch.cat(kls)
    return Agreement(
        rel_logit_error=(diff_sq / ref_sq) ** 0.5,
        rms_abs_error=(diff_sq / count) ** 0.5,
        kl_mean=kl.mean().item(),
        kl_max=kl.max().item(),
        top1_agreement=torch.cat(agree).mean().item(),
    )


def _passes(engine: Agreement, hf: Agreement, dtype: torch.dtype, positions: int) -> bool:
    if dtype == torch.float32:
        t = FP32_TOLERANCE
        return (
            engine.rel_logit_error <= t["rel"]
            and engine.kl_mean <= t["kl"]
            and engine.top1_agreement >= t["top1"]
        )
    f, s = LOW_PRECISION_FACTOR, LOW_PRECISION_SLACK
    return (
        engine.rel_logit_error <= f["rel"] * hf.rel_logit_error + s["rel"]
        and engine.kl_mean <= f["kl"] * hf.kl_mean + s["kl"]
        and engine.top1_agreement >= hf.top1_agreement - _top1_slack(hf, positions)
    )


def _top1_slack(hf: Agreement, positions: int) -> float:
    """Top-1 agreement over N positions is a binomial count: allow 3 standard deviations (at least the fixed
    slack). Random-weight logits are nearly flat, so whether the argmax survives rounding is a coin flip."""
    p = hf.top1_agreement
    return max(LOW_PRECISION_SLACK["top1"], 3 * (p * (1 - p) / max(1, positions)) ** 0.5)


def compare(
    engine: LLMEngine, ref: nn.Module, prompts: list[list[int]], greedy_tokens: int, path: str
) -> VerifyReport:
    start = time.perf_counter()
    with use_reference(path == "reference"):
        ours = _engine_logits(engine, prompts)
        alone = [_engine_logits(engine, [p])[0] for p in prompts]
        params = SamplingParams(temperature=0.0, max_tokens=greedy_tokens, ignore_eos=True)
        rid = f"verify-{path}-"
        generated: dict[str, list[int]] = {}

        def collect(outputs: list) -> None:
            for o in outputs:
                if o.finished:
                    generated[o.request_id] = o.outputs[0].token_ids

        # the first prompt prefills alone (an idle server's path, prefill graphs included) and decodes alone for
        # a few steps (the single-stream decode graph, with the greedy screen on CUDA: the decode benchmark's
        # path); the others arrive together while it decodes (a multi-prompt prefill in a mixed step, then
        # batched decode)
        engine.add_request(rid + "0", prompts[0], params)
        for _ in range(1 + SOLO_DECODE_STEPS):
            if engine.has_unfinished_requests():
                collect(engine.step())
        for i, p in enumerate(prompts[1:], 1):
            engine.add_request(rid + str(i), p, params)
        while engine.has_unfinished_requests():
            collect(engine.step())
    device = engine.device
    with torch.inference_mode():
        hf = [ref(torch.tensor([p], device=device)).logits[0].float() for p in prompts]
        with _Upcast(ref) as upcast:
            truth = [upcast(torch.tensor([p], device=device)).logits[0].float() for p in prompts]
    mine, theirs, solo = _agreement(ours, truth), _agreement(hf, truth), _agreement(alone, truth)
    tie_margin = 1e-3 if engine.dtype == torch.float32 else 4 * theirs.rms_abs_error
    matches, greedy_ok = [], True
    for i, prompt in enumerate(prompts):
        expected, ref_logits = _reference_greedy(ref, prompt, greedy_tokens, device)
        got = generated[rid + str(i)]
        n = next((j for j, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        matches.append(n)
        if n < greedy_tokens:
            step = ref_logits[n]
            margin = (step.max() - step[got[n]]).item()
            if margin > tie_margin:
                greedy_ok = False
                log.warning(
                    "prompt %d: greedy diverges at token %d, reference margin %.3g > %.3g",
                    i,
                    n,
                    margin,
                    tie_margin,
                )
    return VerifyReport(
        dtype=str(engine.dtype).replace("torch.", ""),
        path=path,
        prompt_lens=[len(p) for p in prompts],
        engine=mine,
        engine_alone=solo,
        transformers=theirs,
        greedy_match=matches,
        greedy_tokens=greedy_tokens,
        greedy_ok=greedy_ok,
        passed=all(_passes(a, theirs, engine.dtype, sum(len(p) for p in prompts)) for a in (mine, solo))
        and greedy_ok,
        seconds=time.perf_counter() - start,
    )


def run_verify(ns: argparse.Namespace) -> int:
    args = engine_args_from(ns)
    paths = [p.strip() for p in ns.paths.split(",") if p.strip()]
    for path in paths:
        if path not in ("fast", "reference"):
            raise ValueError(f"--paths takes fast and/or reference, got {path!r}")
        if path == "reference" and args.mma_experts_only:
            raise ValueError(
                "--paths reference needs the experts' bf16 weights, which --mma-experts-only releases"
            )
    if "reference" in paths and args.mma_experts_only is None:
        args = replace(args, mma_experts_only=False)  # the default would release what the reference path runs
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
    for path in paths:
        report = compare(engine, ref, prompts, ns.greedy_tokens, path)
        reports.append(report)
        print(_format(report), flush=True)
    if ns.json:
        Path(ns.json).write_text(json.dumps([asdict(r) for r in reports], indent=2))
    return 0 if all(r.passed for r in reports) else 1


def _format(r: VerifyReport) -> str:
    def row(name: str, a: Agreement) -> str:
        return (
            f"  {name:<22} rel err {a.rel_logit_error:.3e}  rms {a.rms_abs_error:.3e}  KL mean {a.kl_mean:.3e}"
            f"  max {a.kl_max:.3e}  top-1 {a.top1_agreement:.4f}"
        )

    if r.dtype == "float32":
        rule = f"rule: engine within rel {FP32_TOLERANCE['rel']:g}, KL {FP32_TOLERANCE['kl']:g}, top-1 1.0 of the truth"
    else:
        rule = (
            f"rule: engine rel <= {LOW_PRECISION_FACTOR['rel']}x transformers' + {LOW_PRECISION_SLACK['rel']}, "
            f"KL <= {LOW_PRECISION_FACTOR['kl']}x + {LOW_PRECISION_SLACK['kl']:g}, "
            f"top-1 >= transformers' - max({LOW_PRECISION_SLACK['top1']}, 3 binomial sd)"
        )
    return "\n".join(
        [
            f"verify [{r.path} path, {r.dtype}] prompts {r.prompt_lens}: {'PASS' if r.passed else 'FAIL'}",
            "  teacher-forced logits against the fp32 truth (transformers, fp32 compute, same weights):",
            row(f"hyserve {r.dtype}", r.engine),
            row(f"hyserve {r.dtype} alone", r.engine_alone),
            row(f"transformers {r.dtype}", r.transformers),
            f"  {rule}",
            f"  greedy match with transformers {r.greedy_match} of {r.greedy_tokens} tokens; "
            f"divergences only within the reference's noise: {r.greedy_ok}",
            f"  {r.seconds:.1f} s",
        ]
    )
