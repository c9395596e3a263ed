"""Tune a small decode batch's tile plans on its own graph-replayed step (``hyserve.bench.step_tuner``).

usage: python scripts/tune_step.py --model DIR --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 8
       --max-model-len 8192 [--batch 1] [--prompt-len 384] [--replays 300] [--noise-us 3]
       [--groups gemv,moe,gdn,attention] [--passes 1] [--out DIR]   (--groups may add "screen", "options", "qk",
       "l2pf", "regs") [--shapes 12608x2048,...]

Per variant: its plans patched into the kernels' tables (the GEMV plans, the MoE bucket, the DeltaNet step's
tiles and the greedy screen's plan that serve ``--batch``, the decode attention config), that batch size's
decode graphs captured again, ``--batch`` fresh requests of the same random prompt prefilled eagerly and
decoded two tokens with logprobs (so through the full-head graph), then the greedy-only graph replayed back to
back on their state (median of 5 blocks). A variant whose logprob is not finite fails; one whose first decoded
token differs from the baseline's, or keeps it with a logprob moved by more than 0.1 nats, is flagged (the
dummy model's bf16 logits move with any change of summation order, so that alone is not an error). The plans
this keeps must still pass ``hyserve verify`` before they are committed; the tables are written to ``--out``
(gemv.json, the MoE table, attention.json, and the DeltaNet step's and the screen's tiles as text, for their
constants in the kernels' modules).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch

from hyserve import SamplingParams
from hyserve.bench.step_tuner import Knob, Trial, coordinate_descent
from hyserve.engine.args import add_engine_arguments, engine_args_from
from hyserve.llm import LLM

# by module path: hyserve.kernels re-exports ops under their packages' names (hyserve.kernels.linear is a function)
attention = importlib.import_module("hyserve.kernels.attention")
gdn = importlib.import_module("hyserve.kernels.gdn_decode_step.triton_kernel")
linear = importlib.import_module("hyserve.kernels.linear")
moe_configs = importlib.import_module("hyserve.kernels.moe.configs")
greedy = importlib.import_module("hyserve.kernels.greedy_head.triton_kernel")
# in_proj, out_proj / o_proj, attention qkv; then the same with the routed projections' 256 router rows (their own
# entries in gemv.json, one token only: kernels/routed_projection), tuned where the table has them
ROUTED_SHAPES = ("12608x2048", "2304x4096", "9472x2048")
ROUTED_OUT = "2304x4096"  # the routing out-projection's plan: also its M_SPLIT (kernels/routed_projection)
GEMV_SHAPES = ("12352x2048", "2048x4096", "9216x2048", *ROUTED_SHAPES)


def knobs(groups: set[str], state: dict, batch: int = 1, only: tuple[str, ...] = GEMV_SHAPES) -> list[Knob]:
    """The knobs of the chosen groups: tile sizes (gemv, moe, gdn, attention, screen), and (options) the
    kernels' optional paths that won alone and lost in earlier steps, tried again in this one. Above batch 1
    only what serves that batch alone is tuned: the MoE bucket, the DeltaNet step's and the screen's entries,
    and which GEMV shapes take that many rows (``max_rows``); the GEMV tiles and the attention config serve
    every batch size, so they are tuned at batch 1."""
    out = []
    shapes = [s for s in GEMV_SHAPES if s in state["gemv"] and s in only]
    if batch > 1:
        if "gemv" in groups:  # None: no cap (every row count up to GEMV_MAX_ROWS)
            out += [Knob(("gemv", s, "max_rows"), (1, 2, None)) for s in shapes if s not in ROUTED_SHAPES]
        groups = groups - {"gemv", "attention"}
    if "gemv" in groups:
        for s in shapes:
            out += [
                Knob(("gemv", s, "BLOCK_N"), (1, 2, 4, 8)),
                Knob(("gemv", s, "BLOCK_K"), (512, 1024, 2048)),
                Knob(("gemv", s, "num_warps"), (2, 4, 8)),
                Knob(("gemv", s, "BCAST_X"), (None, 1)),
                Knob(("gemv", s, "REDUCE_EACH"), (None, 1)),
            ]
            # the routing out-projection, whole plans: M_SPLIT, and K tiles up to the whole row, loaded before
            # the PDL wait while the DeltaNet step or the attention leaves HBM idle (REDUCE_EACH and a register
            # cap keep more such programs an SM)
            if s == ROUTED_OUT:
                plan = {k: v for k, v in state["gemv"][s].items() if k not in ("maxnreg", "REDUCE_EACH")}
                variants = (
                    (2048, 1, 4, None, None), (2048, 2, 4, None, None), (2048, 2, 4, 1, None), (2048, 4, 4, 1, None),
                    (4096, 1, 4, 1, None), (4096, 2, 4, 1, None), (4096, 2, 4, 1, 40), (4096, 2, 4, None, None),
                    (4096, 2, 8, 1, None),
                )  # fmt: skip
                out.append(
                    Knob(
                        ("gemv", s),
                        tuple(
                            {**plan, "BLOCK_K": bk, "M_SPLIT": sp, "num_warps": nw}
                            | ({"REDUCE_EACH": 1} if re else {})
                            | ({"maxnreg": mx} if mx else {})
                            for bk, sp, nw, re, mx in variants
                        ),
                    )
                )
    if "moe" in groups:
        out += [
            Knob(("moe", "router_be"), (2, 4, 8, 16)),
            Knob(("moe", "gate_up", "BLOCK_I"), (2, 4, 8)),
            Knob(("moe", "gate_up", "BLOCK_K"), (128, 256, 512)),
            Knob(("moe", "gate_up", "num_warps"), (2, 4, 8)),
            Knob(("moe", "down", "BLOCK_H"), (1, 2, 4)),
            Knob(("moe", "down", "BLOCK_I"), (64, 128, 256)),
            Knob(("moe", "down", "num_warps"), (2, 4, 8)),
        ]
    if "gdn" in groups:
        out += [Knob(("gdn", "bv"), (16, 32, 64, 128)), Knob(("gdn", "warps"), (2, 4, 8))]
    if "attention" in groups:
        out += [
            Knob(("attention", "block_n"), (32, 64, 128)),
            Knob(("attention", "num_warps"), (4, 8)),
            Knob(("attention", "num_stages"), (1, 2, 3)),
            Knob(("attention", "waves"), (2.0, 4.0, 8.0)),
        ]
    if "screen" in groups:  # the greedy screen's plan for this batch: (BLOCK_V, BLOCK_K, warps, TMA stages)
        out.append(
            Knob(
                ("screen",),
                ((32, 128, 4, 4), (64, 128, 4, 3), (64, 256, 4, 3), (128, 64, 4, 4), (64, 128, 8, 4)),
            )
        )
    if "options" in groups:
        for s in shapes if batch == 1 else ():  # TMA: a K tile of at most 256 (kernels/linear), whole plans
            plan = state["gemv"][s]
            out.append(Knob(("gemv", s), tuple({**plan, "BLOCK_K": 256, "TMA": st} for st in (3, 4))))
        out += [
            Knob(("moe", "gate_up", "REDUCE_EACH"), (None, True)),
            Knob(("moe", "gate_up", "PREFETCH"), (None, True)),
            Knob(("moe", "gate_up", "TMA"), (None, 3, 4)),
            Knob(("moe", "gate_up", "BCAST_X"), (None, True)),
            Knob(("moe", "gate_up", "SHARED_FIRST"), (None, True)),
            Knob(("moe", "down", "REDUCE_EACH"), (None, True)),
            Knob(("moe", "down", "PREFETCH"), (None, True)),
            Knob(("moe", "split_shared"), (None, True)),
            Knob(("moe", "topk_in_experts"), (None, True)),
            Knob(("attention", "fused_qk"), (False, True)),  # attention.decode_attention's one kernel
        ]
        if batch == 1:
            out.append(Knob(("attention", "fused_reduce"), (False, True)))
    if "qk" in groups:  # the one knob alone: a quick A/B of decode_attention's one kernel against two
        out.append(Knob(("attention", "fused_qk"), (False, True)))
    if "regs" in groups:  # a register cap (more programs an SM, maybe spills): the pairs kernels, the GEMVs
        out += [Knob(("moe", part, "maxnreg"), (None, 56, 64, 72)) for part in ("gate_up", "down")]
        if batch == 1:
            out += [Knob(("gemv", s, "maxnreg"), (None, 64, 72, 80)) for s in shapes]
    if "l2pf" in groups:  # gate_up's programs prefetching the shared expert into L2 (kernels/l2_prefetch.py)
        out.append(Knob(("moe", "gate_up", "L2PF"), (None, 64, 128, 256)))
    return out


class StepBench:
    """The engine with one decode batch size's graphs, re-captured per variant; ``measure`` is the tuner's
    callback. The tables' entries that serve that batch size are the state (the MoE bucket, the DeltaNet step's
    bound, the screen's row count); the GEMV plans are per shape at any row count up to their max_rows."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.llm = LLM.from_engine_args(engine_args_from(ns))
        self.engine = self.llm.engine
        cfg = self.engine.config
        self.moe_key = (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, self.engine.runner.dtype)
        self.tables = {
            "gemv": linear._plans(),
            "moe": moe_configs._table(*self.moe_key),
            "gdn": gdn._CONFIGS,
            "attention": attention._configs(),
            "screen": greedy.SCREEN_PLAN,
        }
        self.batch = ns.batch
        if not 1 <= self.batch <= greedy.MAX_ROWS:
            raise ValueError(
                f"--batch must be in 1..{greedy.MAX_ROWS} (the greedy-only graphs), got {self.batch}"
            )
        if self.tables["moe"] is None:
            raise ValueError(f"no MoE plan table for {self.moe_key} (kernels/moe/configs)")
        # the entries of the tables that serve this batch size (the first bound or bucket >= it)
        self.moe_bucket = min(
            (k for k in self.tables["moe"] if k >= self.batch), default=max(self.tables["moe"])
        )
        self.gdn_entry = next(i for i, (bound, _, _) in enumerate(gdn._CONFIGS) if bound >= self.batch)
        # an entry that also serves batches above the greedy graphs' is not changed: the state goes into a new
        # entry for batches up to MAX_ROWS, inserted before it
        self.gdn_bound = min(gdn._CONFIGS[self.gdn_entry][0], greedy.MAX_ROWS)
        self.screen_rows = min(p for p in greedy.SCREEN_PLAN if p >= self.batch)
        gen = torch.Generator().manual_seed(0)
        self.prompt = torch.randint(0, min(cfg.vocab_size, 248044), (ns.prompt_len,), generator=gen).tolist()
        self.replays = ns.replays
        self.max_model_len = ns.max_model_len
        self.reference: tuple[int, float] | None = None
        self.count = 0

    def state(self) -> dict:
        t = self.tables
        _, bv, warps = t["gdn"][self.gdn_entry]
        return {
            "gemv": {s: dict(t["gemv"][s]) for s in GEMV_SHAPES if s in t["gemv"]},
            "moe": json.loads(json.dumps(t["moe"][self.moe_bucket])),
            "gdn": {"bv": bv, "warps": warps},
            "attention": dict(t["attention"]["decode"]["default"]),
            "screen": t["screen"][self.screen_rows],
        }

    def apply(self, state: dict) -> None:
        t = self.tables
        gemv_plans = {**t["gemv"], **state["gemv"]}
        moe_table = {**t["moe"], self.moe_bucket: state["moe"]}
        att = {**t["attention"], "decode": {"default": state["attention"]}}
        linear._plans = lambda: gemv_plans
        moe_configs._table = lambda *key: moe_table
        configs = list(t["gdn"])
        entry = (self.gdn_bound, state["gdn"]["bv"], state["gdn"]["warps"])
        if configs[self.gdn_entry][0] == self.gdn_bound:
            configs[self.gdn_entry] = entry
        else:
            configs.insert(self.gdn_entry, entry)
        gdn._CONFIGS = tuple(configs)
        attention._configs = lambda: att
        greedy.SCREEN_PLAN = {**t["screen"], self.screen_rows: tuple(state["screen"])}

    def measure(self, state: dict) -> float:
        self.apply(state)
        runner = self.engine.runner
        runner.graphs = None
        gc.collect()
        torch.cuda.empty_cache()
        b = self.batch
        runner.capture_graphs([b], self.max_model_len, progress=False)
        if runner.graphs is None or b not in runner.graphs.greedy_graphs:
            raise RuntimeError(f"the batch-{b} graphs did not capture")
        self.count += 1
        rids = [f"tune-{self.count}-{i}" for i in range(b)]
        params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, logprobs=0)
        for rid in rids:  # the same prompt b times: the first one's first decoded token is checked
            self.engine.add_request(rid, self.prompt, params)
        tokens, logprobs, done = [], [], set()
        while len(done) < b:
            for out in self.engine.step():
                if out.request_id in rids and len(out.outputs[0].token_ids) >= 3:
                    done.add(out.request_id)
                    if out.request_id == rids[0] and not tokens:
                        tokens = out.outputs[0].token_ids
                        logprobs = [lp[0] for lp in out.outputs[0].logprobs or []]
        token, logprob = tokens[1], logprobs[1]  # the first token a decode graph produced
        if not math.isfinite(logprob):
            raise RuntimeError(f"logprob {logprob}")
        if self.reference is None:
            self.reference = (token, logprob)
        elif token != self.reference[0]:
            print(f"  (token {token} against the baseline's {self.reference[0]}, logprob {logprob:.3f})")
        elif abs(logprob - self.reference[1]) > 0.1:  # the same token, but its logprob moved: worth a look
            print(f"  (the same token, logprob {logprob:.3f} against the baseline's {self.reference[1]:.3f})")
        graph = runner.graphs.greedy_graphs[b].graph
        torch.cuda.synchronize()
        blocks = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(self.replays // 5):
                graph.replay()
            torch.cuda.synchronize()
            blocks.append((time.perf_counter() - t0) / (self.replays // 5) * 1e6)
        for rid in rids:
            self.engine.abort_request(rid)
        while self.engine.has_unfinished_requests():
            self.engine.step()
        return statistics.median(blocks)

    def write(self, state: dict, out_dir: str) -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        gemv_doc = json.loads(linear.CONFIG_PATH.read_text())
        gemv_doc["plans"].update(state["gemv"])
        (out / "gemv.json").write_text(json.dumps(gemv_doc, indent=1) + "\n")
        path = moe_configs.config_path(*self.moe_key)
        moe_doc = json.loads(path.read_text())
        moe_doc["buckets"][str(self.moe_bucket)] = state["moe"]
        (out / path.name).write_text(json.dumps(moe_doc, indent=1) + "\n")
        att_doc = json.loads((Path(attention.__file__).parent / "configs" / "attention.json").read_text())
        att_doc["decode"]["default"] = state["attention"]
        (out / "attention.json").write_text(json.dumps(att_doc, indent=2) + "\n")
        (out / "gdn_screen.txt").write_text(
            f"DeltaNet step, batch <= {self.gdn_bound}: {state['gdn']}\n"
            f"screen, {self.screen_rows} rows: {state['screen']}\n"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, model_required=True)
    parser.add_argument("--batch", type=int, default=1, help="the decode batch size to tune (1..4)")
    parser.add_argument("--prompt-len", type=int, default=384)
    parser.add_argument("--replays", type=int, default=300)
    parser.add_argument("--noise-us", type=float, default=3.0)
    parser.add_argument(
        "--groups", default="gemv,moe,gdn,attention", help="also: screen, options, qk, l2pf, regs"
    )
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/tune_step"))
    parser.add_argument(
        "--shapes", default=",".join(GEMV_SHAPES), help="the GEMV shapes the gemv / regs groups tune"
    )
    ns = parser.parse_args()
    ns.cuda_graph_sizes, ns.prefill_graph_sizes, ns.warmup = str(ns.batch), "none", False
    bench = StepBench(ns)
    start = bench.state()

    def log(t: Trial) -> None:
        us = "failed" if t.us is None else f"{t.us:8.1f} us"
        print(f"{t.knob:40s} {t.value!s:>8} {us} {t.note}", flush=True)

    best, trials = start, []
    for _ in range(ns.passes):  # a later pass starts from the last one's plans (a kept value can move others)
        kn = knobs(set(ns.groups.split(",")), best, ns.batch, tuple(ns.shapes.split(",")))
        best, more = coordinate_descent(best, kn, bench.measure, ns.noise_us, log)
        trials += more
    final = next((t.us for t in reversed(trials) if t.note == "kept"), trials[0].us)
    print(f"\nbaseline {trials[0].us:.1f} us, tuned {final:.1f} us ({len(trials)} trials)")
    for group in best:
        if best[group] != start[group]:
            print(f"{group}: {start[group]} -> {best[group]}")
    bench.write(best, ns.out)
    print(f"wrote the tables to {ns.out}")


if __name__ == "__main__":
    main()
