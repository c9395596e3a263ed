"""Where a fresh engine's first prefill differs from the same prefill run again: the input and output of every
module (decoder-layer mixers, FFNs, projections) and of every ``hyserve.kernels`` op between them, recorded in call
order on each run; then the first call whose output differs bit for bit is named, with whether its inputs already
differed (if not, that module or op computed differently).

usage: python scripts/diff_first_prefill.py --model DIR --load-format dummy --no-warmup --prefill-graph-sizes none
       [--prompt-len 384] [--runs 3]

``scripts/check_repeat.py`` found the first request of an engine started with ``--no-warmup`` giving other bits
than every later one (H100, 2026-12-06); this script traced it to the first attention layer's causal attention
(torch's SDPA backend priority list, fixed in ``kernels/attention/causal.py``; docs/performance.md).
"""

from __future__ import annotations

import argparse

import torch

from hyserve import SamplingParams
from hyserve import kernels as ops
from hyserve.engine.args import add_engine_arguments, engine_args_from
from hyserve.llm import LLM


def _first_tensor(value) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    return None


def _small_tensors(values) -> list[torch.Tensor]:
    """Copies of the tensors among ``values`` (a tuple or one value) under 64 MB: not the KV cache or the states."""
    values = values if isinstance(values, (tuple, list)) else (values,)
    return [
        v.detach().to("cpu", copy=True) for v in values if isinstance(v, torch.Tensor) and v.nbytes < 1 << 26
    ]


def _recorded(name: str, fn, records: list):
    def call(*args, **kwargs):
        inputs = _small_tensors(args)
        out = fn(*args, **kwargs)
        if records:
            records[-1].append((f"ops.{name}", inputs, _small_tensors(out)))
        return out

    return call


def _equal(a, b) -> bool:
    if a is None or b is None:
        return True
    if isinstance(a, list):
        return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and torch.equal(a, b)


def _max_diff(a, b) -> float:
    a, b = (a, b) if isinstance(a, list) else ([a], [b])
    return max(
        ((x.float() - y.float()).abs().max().item() for x, y in zip(a, b) if x.shape == y.shape), default=0.0
    )


def _aligned(a: list, b: list, r: int):
    """Pairs of records of the same module or op, in call order; a call only one run made (e.g. the RoPE tables
    built on the first forward) is printed and skipped."""
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][0] == b[j][0]:
            yield a[i], b[j]
            i, j = i + 1, j + 1
        elif len(a) - i > len(b) - j:
            print(f"run 0 vs run {r}: {a[i][0]} called in run 0 only")
            i += 1
        else:
            print(f"run 0 vs run {r}: {b[j][0]} called in run {r} only")
            j += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, model_required=True)
    parser.add_argument("--prompt-len", type=int, default=384)
    parser.add_argument("--runs", type=int, default=3)
    ns = parser.parse_args()
    llm = LLM.from_engine_args(engine_args_from(ns))
    engine = llm.engine
    model = engine.runner.model
    records: list[list[tuple[str, torch.Tensor | None, torch.Tensor | None]]] = []

    # the mixers update x in place: inputs are copied before. Copies go to the host: a 384-token prefill makes
    # ~440 calls, and the op-level run with device copies stopped after its first run on an H100 (memory suspected)
    inputs: dict[str, torch.Tensor | None] = {}

    def before(name: str):
        def save(module, args) -> None:
            x = _first_tensor(args)
            inputs[name] = None if x is None else x.detach().to("cpu", copy=True)

        return save

    def after(name: str):
        def record(module, args, output) -> None:
            if records:
                y = _first_tensor(output)
                records[-1].append(
                    (name, inputs.pop(name, None), None if y is None else y.detach().to("cpu", copy=True))
                )

        return record

    for name, module in model.named_modules():
        if name and "." in name and not name.endswith("norm"):
            module.register_forward_pre_hook(before(name))
            module.register_forward_hook(after(name))
    for name, fn in list(vars(ops).items()):  # the ops the model calls between its modules
        if callable(fn) and not name.startswith("_") and not isinstance(fn, type):
            setattr(ops, name, _recorded(name, fn, records))
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, min(engine.config.vocab_size, 248044), (ns.prompt_len,), generator=gen).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=0)
    for r in range(ns.runs):
        records.append([])
        out = llm.generate(prompt, params)[0].outputs[0]
        lp = out.logprobs[0][0]
        print(f"run {r}: token {out.token_ids[0]} logprob {lp:.6f}, {len(records[-1])} module calls")
    base = records[0]
    for r in range(1, ns.runs):
        other = records[r]
        found = False
        for (name, x0, y0), (_, x1, y1) in _aligned(base, other, r):
            same_in, same_out = _equal(x0, x1), _equal(y0, y1)
            if not same_out:
                diff = _max_diff(y0, y1)
                where = (
                    "inputs equal: this module computed differently" if same_in else "inputs already differ"
                )
                print(f"run 0 vs run {r}: first output difference at {name} (max |diff| {diff:.3e}; {where})")
                found = True
                break
        if not found:
            print(f"run 0 vs run {r}: every recorded module output identical")


if __name__ == "__main__":
    main()
