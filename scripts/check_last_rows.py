"""The last layer at the sampled rows only, on the GPU: same first-token logprobs as the last layer at every row.

usage: python scripts/check_last_rows.py --model DIR --load-format dummy [--prompt-lens 128,1024,4096]

A prefill step that samples a prompt's last row runs the last layer's attention queries (or DeltaNet output
norm and out-projection) and FFN at that row only (``TextModel.forward``); a step that wants every row's logits
(prompt logprobs, ``runner.score``) runs them everywhere. Both are eager here, on one fresh prompt per length,
and the last row's log-softmax is compared: the largest difference over the full path's top 20, and whether the
top-1 agrees. The two differ in rounding only: the sampled row attends through the paged decode kernel instead
of the prompt's causal attention, and its MoE takes the few-token kernels. Exits non-zero past ``--max-nats``.
"""

from __future__ import annotations

import argparse

import torch

from hyserve import SamplingParams
from hyserve.engine.args import add_engine_arguments, engine_args_from
from hyserve.engine.scheduler import ScheduledSequence, SchedulerOutput
from hyserve.engine.sequence import Sequence
from hyserve.llm import LLM


@torch.inference_mode()
def _last_row_logprobs(engine, prompt: list[int], all_rows: bool) -> torch.Tensor:
    """log-softmax [vocab] fp32 of the prompt's last row, from one eager prefill step."""
    seq = Sequence("check", prompt, SamplingParams())
    engine.cache_manager.allocate(seq, len(prompt))
    out = SchedulerOutput([ScheduledSequence(seq, len(prompt), sample=True)])
    runner = engine.runner
    batch = runner.prepare(out, all_logits=all_rows)
    logits = runner.model.compute_logits(runner.model(batch, runner.cache))[-1]
    engine.cache_manager.free(seq)
    return torch.log_softmax(logits.float(), dim=-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, model_required=True)
    parser.add_argument("--prompt-lens", default="128,1024,4096")
    parser.add_argument("--max-nats", type=float, default=0.5)
    ns = parser.parse_args()
    engine = LLM.from_engine_args(engine_args_from(ns)).engine
    gen = torch.Generator().manual_seed(0)
    high = min(engine.config.vocab_size, 248044)
    worst = 0.0
    print(f"{'prompt':>6} {'top-20 max |diff| nats':>22} {'top-1 same':>10} {'noise':>7}")
    for n in [int(x) for x in ns.prompt_lens.split(",")]:
        prompt = torch.randint(0, high, (n,), generator=gen).tolist()
        full = _last_row_logprobs(engine, prompt, all_rows=True)
        rows = _last_row_logprobs(engine, prompt, all_rows=False)
        again = _last_row_logprobs(engine, prompt, all_rows=False)
        top = torch.topk(full, 20).indices
        diff = (full[top] - rows[top]).abs().max().item()
        noise = (rows[top] - again[top]).abs().max().item()
        same = int(full.argmax()) == int(rows.argmax())
        worst = max(worst, diff)
        print(f"{n:>6} {diff:22.4f} {str(same):>10} {noise:7.4f}")
    if worst > ns.max_nats:
        raise SystemExit(f"the sampled-rows path differs by {worst:.3f} nats (> --max-nats {ns.max_nats})")


if __name__ == "__main__":
    main()
