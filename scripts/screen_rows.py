"""How many LM-head rows the greedy screen leaves to compute exactly, on a model's own hidden states.

usage: python scripts/screen_rows.py --model DIR [--device cpu] [--prompts 60] [--max-tokens 5] [--load-format ...]

Generates greedily from random addition prompts (the demo model's task; any model folder works, the prompts are
then just text), catches the hidden states the LM head receives, and runs the screen's torch reference
(``kernels/greedy_head``) on them: the rows computed exactly per token (mean, median, p90, max), the top-1 to
top-2 logit gap against the bound's main term (radius x ||x||), and a check that every screened token equals the full head's. The
dummy 35B model leaves ~40 of 248320 rows (``greedy_head.bench``); a trained head separates its logits more.
"""

from __future__ import annotations

import argparse
import random

import torch

from hyserve import LLM, SamplingParams
from hyserve.kernels.greedy_head import build_greedy_screen, greedy_reference, screened_greedy_reference


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--prompts", type=int, default=60)
    p.add_argument("--max-tokens", type=int, default=5)
    a = p.parse_args()
    llm = LLM(a.model, device=a.device, load_format=a.load_format, progress=False, greedy_screen=False)
    head = llm.engine.model.lm_head
    caught: list[torch.Tensor] = []
    head.register_forward_pre_hook(lambda _, args: caught.append(args[0].detach().float().clone()))
    rng = random.Random(0)
    prompts = [f"{rng.randint(0, 99)}+{rng.randint(0, 99)}=" for _ in range(a.prompts)]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True))
    x, weight = torch.cat(caught), head.weight
    screen = build_greedy_screen(weight)
    tokens, rows = [], []
    for chunk in x.split(64):  # the reference holds [rows, V] logits
        t, r = screened_greedy_reference(chunk, weight, screen)
        if t.tolist() != greedy_reference(chunk, weight).tolist():
            raise SystemExit("a screened token differs from the full head's")
        tokens.append(t)
        rows.append(r.float())
    r = torch.cat(rows)
    top2 = (x @ weight.float().T).topk(2, dim=1).values
    radius = screen.radius[torch.cat(tokens)] * x.norm(
        dim=1
    )  # the bound's main term (the limbs' term is ~1/127 of it)
    print(f"{x.shape[0]} tokens, vocab {weight.shape[0]}, hidden {weight.shape[1]}")
    print(
        f"rows computed exactly per token: mean {r.mean():.2f}, median {r.median():.0f}, "
        f"p90 {r.quantile(0.9):.0f}, max {r.max():.0f}"
    )
    print(
        f"top-1 minus top-2 logit: median {(top2[:, 0] - top2[:, 1]).median():.3f}; radius x ||x||: median "
        f"{radius.median():.4f}"
    )


if __name__ == "__main__":
    main()
