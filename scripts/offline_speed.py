"""Quick offline throughput probe of the engine (no HTTP): decode tok/s at a few batch sizes.

usage: python scripts/offline_speed.py --model DIR [--load-format dummy] [--batch 1,32] [--prompt-len 128]
       [--output-len 128]
The server benchmark (`hyserve bench`) is the number of record; this isolates the engine.
"""

from __future__ import annotations

import argparse
import time

import torch

from hyserve import SamplingParams
from hyserve.engine.args import add_engine_arguments, engine_args_from
from hyserve.llm import LLM


def main() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, model_required=True)
    parser.add_argument("--batch", default="1,32")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    ns = parser.parse_args()
    llm = LLM.from_engine_args(engine_args_from(ns))
    engine = llm.engine
    gen = torch.Generator().manual_seed(0)
    rows = []
    for b in [int(x) for x in ns.batch.split(",")]:
        high = min(engine.config.vocab_size, 248044)
        prompts = [torch.randint(0, high, (ns.prompt_len,), generator=gen).tolist() for _ in range(b)]
        params = SamplingParams(temperature=0.0, max_tokens=ns.output_len, ignore_eos=True)
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm-up
        for i, p in enumerate(prompts):
            engine.add_request(f"speed-{b}-{i}", p, params)
        t0 = time.perf_counter()
        first = None
        steps = 0
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
            if first is None:
                if engine.device.type == "cuda":
                    torch.cuda.synchronize()
                first = time.perf_counter()
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        decode_steps = steps - 1
        tpot = (t1 - first) / max(1, decode_steps)
        rows.append((b, first - t0, tpot * 1e3, b / tpot, b * ns.output_len / (t1 - t0)))
    print(f"{'batch':>5} {'prefill s':>10} {'TPOT ms':>8} {'decode tok/s':>13} {'e2e tok/s':>10}")
    for r in rows:
        print(f"{r[0]:>5} {r[1]:>10.3f} {r[2]:>8.2f} {r[3]:>13.1f} {r[4]:>10.1f}")


if __name__ == "__main__":
    main()
