"""The same greedy request, again and again on one engine, gives the same tokens and logprobs bit for bit: the
GPU side of ``tests/test_slot_reuse.py`` (which runs the CPU paths), through the prefill graphs, the decode
graphs, async scheduling and the greedy screen.

usage: python scripts/check_repeat.py --model DIR --load-format dummy [--prompt-lens 384,512] [--tokens 6]

For each prompt length: the prompt with logprobs (the full LM head), a plain greedy run of it (the greedy
screen, greedy-only graphs), another prompt in between (which takes the freed slot and blocks), then both
runs of the prompt again, twice. Prints each run's tokens, the first position where it differs from the
first run of its kind, and exits non-zero if any repeat differs. A 384-token prompt runs padded in the
512-token prefill graph, a 512-token one exactly.
"""

from __future__ import annotations

import argparse
import gc

import torch

from hyserve import SamplingParams
from hyserve.engine.args import add_engine_arguments, engine_args_from
from hyserve.llm import LLM


def _run(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[list[int], list[float]]:
    """(tokens, logprobs of the chosen tokens; empty without logprobs) of one request run alone."""
    out = llm.generate(prompt, params)[0].outputs[0]
    return list(out.token_ids), [lp[0] for lp in out.logprobs or []]


def _first_difference(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]]) -> int | None:
    """The first position whose token or logprob differs (None: bit-identical)."""
    for i, (ta, tb) in enumerate(zip(a[0], b[0])):
        if ta != tb or (i < len(a[1]) and a[1][i] != b[1][i]):
            return i
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, model_required=True)
    parser.add_argument("--prompt-lens", default="384,512")
    parser.add_argument("--tokens", type=int, default=6, help="tokens generated a run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each prompt and kind")
    parser.add_argument(
        "--recapture",
        action="store_true",
        help="capture the batch-1 decode graphs again before each round, as scripts/tune_step.py does before a trial",
    )
    ns = parser.parse_args()
    llm = LLM.from_engine_args(engine_args_from(ns))
    engine = llm.engine
    if ns.recapture and engine.runner.graphs is None:
        raise SystemExit("--recapture needs the engine's decode graphs (a CUDA device, no --enforce-eager)")
    gen = torch.Generator().manual_seed(0)
    high = min(engine.config.vocab_size, 248044)
    kinds = {
        "logprobs": SamplingParams(temperature=0.0, max_tokens=ns.tokens, ignore_eos=True, logprobs=0),
        "greedy": SamplingParams(temperature=0.0, max_tokens=ns.tokens, ignore_eos=True),
    }
    ok, count = True, 0
    for n in [int(x) for x in ns.prompt_lens.split(",")]:
        prompt = torch.randint(0, high, (n,), generator=gen).tolist()
        other = torch.randint(0, high, (n // 2 + 7,), generator=gen).tolist()
        first: dict[str, tuple[list[int], list[float]]] = {}
        for r in range(ns.rounds):
            if ns.recapture:
                engine.runner.graphs = None
                gc.collect()
                torch.cuda.empty_cache()
                engine.runner.capture_graphs([1], ns.max_model_len, progress=False)
            for kind, params in kinds.items():
                count += 1
                got = _run(llm, prompt, params)
                first.setdefault(kind, got)
                at = _first_difference(first[kind], got)
                ok &= at is None
                lps = " ".join(f"{x:.4f}" for x in got[1][:3])
                print(
                    f"prompt {n:>5} round {r} {kind:>8}: tokens {got[0]} {lps}  "
                    + ("same" if at is None else f"DIFFERS from round 0 at position {at}")
                )
            count += 1
            _run(llm, other, kinds["greedy"])
        if first["greedy"][0] != first["logprobs"][0]:  # the screen's proof says they agree (ties aside)
            print(f"prompt {n:>5}: the greedy screen's tokens differ from the full head's")
    print(f"{count} requests: " + ("every repeat bit-identical" if ok else "REPEATS DIFFER"))
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
