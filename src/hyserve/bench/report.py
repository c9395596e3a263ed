"""Per-level statistics, the printed table, and the throughput plot."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from hyserve.bench import roofline
from hyserve.bench.scenarios import LevelRun


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linear interpolation between order statistics."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values_s: list[float]) -> dict[str, float] | None:
    """mean/median/p90/p99/min/max of a list of seconds, in milliseconds; None for an empty list."""
    if not values_s:
        return None
    ms = [v * 1e3 for v in values_s]
    stats = {
        "mean": sum(ms) / len(ms),
        "median": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
        "min": min(ms),
        "max": max(ms),
    }
    return {k: round(v, 4) for k, v in stats.items()}


class RooflineModel:
    """The floors of one model on one GPU, for annotating levels (see :mod:`hyserve.bench.roofline`)."""

    def __init__(self, config: dict[str, Any], gpu: roofline.GpuSpec, weight_bytes: float) -> None:
        self.config = config
        self.gpu = gpu
        self.weight_bytes = weight_bytes

    def describe(self) -> dict[str, Any]:
        """The ``roofline`` block of ``results.json``."""
        c = roofline.text_config(self.config)
        return {
            "model_type": c.get("model_type"),
            "gpu": self.gpu.name,
            "hbm_tbps": self.gpu.hbm_bytes_per_s / 1e12,
            "matmul_tflops": self.gpu.matmul_flops / 1e12,
            "weight_bytes": self.weight_bytes,
            "active_params": roofline.active_params_per_token(self.config),
            "weight_gb_per_step_b1": roofline.weight_bytes_per_step(self.config, 1, self.weight_bytes) / 1e9,
            "note": "decode floors exclude prefill; *_with_prefill adds prefill FLOPs at the matrix rate",
        }

    def annotate(self, scenario: str, concurrency: int, prompt_len: int, output_len: int) -> dict[str, float]:
        """Floor numbers for one level: ``roofline_tok_s`` (+ with prefill) or, for ttft, ``ttft_floor_ms``."""
        if scenario == "ttft":
            floor_s = roofline.prefill_floor_s(self.config, prompt_len, self.gpu, self.weight_bytes)
            return {"ttft_floor_ms": floor_s * 1e3}
        args = (self.config, concurrency, prompt_len, output_len, self.gpu, self.weight_bytes)
        return {
            "roofline_tok_s": roofline.throughput_floor_tok_s(*args),
            "roofline_with_prefill_tok_s": roofline.throughput_floor_tok_s(*args, include_prefill=True),
        }


def summarize(run: LevelRun, model: RooflineModel | None = None) -> dict[str, Any]:
    """One entry of ``results.json["results"]``: counts, rates (tokens/s), distributions (ms), floors."""
    spec, results = run.spec, run.results
    good = [r for r in results if r.ok]
    out_tokens = sum(r.completion_tokens for r in good)
    errors = Counter(r.error for r in results if not r.ok)
    missing_usage = sum(not r.usage_reported for r in good)
    short = sum(r.completion_tokens < r.max_tokens for r in good)
    gaps = [b - a for r in good for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:])]
    entry: dict[str, Any] = {
        "scenario": spec.scenario,
        "label": spec.label,
        "concurrency": spec.concurrency,
        "prompt_len": spec.prompt_len,
        "output_len": spec.output_len,
        "num_requests": len(results),
        "completed": len(good),
        "failed": len(results) - len(good),
        "missing_usage": missing_usage,
        "short_outputs": short,
        "ok": len(good) == len(results) and missing_usage == 0 and short == 0,
        "errors": dict(errors.most_common(5)),
        "duration_s": round(run.duration_s, 6),
        "output_tokens": out_tokens,
        "prompt_tokens": sum(r.prompt_tokens or r.prompt_len for r in good),
        "output_tok_s": out_tokens / run.duration_s if run.duration_s > 0 else 0.0,
        "requests_per_s": len(good) / run.duration_s if run.duration_s > 0 else 0.0,
        "ttft_ms": distribution([r.ttft_s for r in good if r.ttft_s is not None]),
        "tpot_ms": distribution([t for r in good if (t := r.tpot_s) is not None]),
        "e2e_ms": distribution([r.e2e_s for r in good if r.e2e_s is not None]),
        "chunk_gap_ms": distribution(gaps),
        "roofline_tok_s": None,
        "roofline_pct": None,
        "roofline_with_prefill_tok_s": None,
        "ttft_floor_ms": None,
    }
    if model is not None:
        entry.update(model.annotate(spec.scenario, spec.concurrency, spec.prompt_len, spec.output_len))
        if entry["roofline_tok_s"]:
            entry["roofline_pct"] = 100.0 * entry["output_tok_s"] / entry["roofline_tok_s"]
    entry["requests"] = [r.to_json() for r in results]
    return entry


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _stat(entry: dict[str, Any], key: str, stat: str) -> float | None:
    d = entry[key]
    return None if d is None else d[stat]


def format_table(levels: list[dict[str, Any]]) -> str:
    """The end-of-run table (times in ms, rates in tokens/s), with a footnote per level that is not clean."""
    has_roof = any(e["roofline_tok_s"] is not None for e in levels)
    head = ["scenario", "conc", "prompt", "output", "reqs", "fail", "out tok/s"]
    head += ["TTFT mean", "TTFT med", "TTFT p90", "TTFT p99", "TPOT mean", "TPOT med", "TPOT p99", "e2e med"]
    if has_roof:
        head += ["roofline tok/s", "% roofline"]
    rows = []
    for e in levels:
        row = [
            e["scenario"] + ("" if e["ok"] else " (!)"),
            str(e["concurrency"]),
            str(e["prompt_len"]),
            str(e["output_len"]),
            str(e["num_requests"]),
            str(e["failed"]),
            "-" if e["scenario"] == "ttft" else _fmt(e["output_tok_s"]),
            _fmt(_stat(e, "ttft_ms", "mean")),
            _fmt(_stat(e, "ttft_ms", "median")),
            _fmt(_stat(e, "ttft_ms", "p90")),
            _fmt(_stat(e, "ttft_ms", "p99")),
            _fmt(_stat(e, "tpot_ms", "mean"), 2),
            _fmt(_stat(e, "tpot_ms", "median"), 2),
            _fmt(_stat(e, "tpot_ms", "p99"), 2),
            _fmt(_stat(e, "e2e_ms", "median")),
        ]
        if has_roof:
            row += [_fmt(e["roofline_tok_s"]), _fmt(e["roofline_pct"])]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    lines.append("TTFT/TPOT/e2e in ms over completed requests; TPOT = (e2e - TTFT) / (completion_tokens - 1)")
    if has_roof:
        lines.append("roofline: HBM/FLOP floor of the decode steps only (prefill excluded)")
    for e in levels:
        if e["ok"]:
            continue
        problems = []
        if e["failed"]:
            errs = "; ".join(f"{n}x {msg}" for msg, n in e["errors"].items())
            problems.append(f"{e['failed']}/{e['num_requests']} requests FAILED ({errs})")
        if e["missing_usage"]:
            problems.append(f"{e['missing_usage']} streams without usage (tokens counted from chunks)")
        if e["short_outputs"]:
            problems.append(
                f"{e['short_outputs']} outputs shorter than max_tokens (ignore_eos not honoured?)"
            )
        lines.append(f"(!) {e['label']}: " + ", ".join(problems))
    return "\n".join(lines)


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _log_x(ax: Any, xs: list[int], xlabel: str) -> None:
    ax.set_xscale("log")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)


def write_plot(levels: list[dict[str, Any]], path: Path, title: str) -> bool:
    """Plot output throughput and median TPOT/TTFT against concurrency (and TTFT against prompt length when
    the ttft scenario ran) to a PNG at ``path``; returns False (and writes nothing) with neither scenario."""
    thr = sorted(
        (e for e in levels if e["scenario"] == "throughput" and e["completed"]),
        key=lambda e: e["concurrency"],
    )
    ttft = sorted(
        (e for e in levels if e["scenario"] == "ttft" and e["completed"]), key=lambda e: e["prompt_len"]
    )
    if not thr and not ttft:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (2 if thr else 0) + (1 if ttft else 0)
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2), squeeze=False)
    ax_iter = iter(axes[0])
    if thr:
        conc = [e["concurrency"] for e in thr]
        ax = next(ax_iter)
        ax.plot(conc, [e["output_tok_s"] for e in thr], "o-", label="measured")
        if thr[0]["roofline_tok_s"] is not None:
            ax.plot(conc, [e["roofline_tok_s"] for e in thr], "k--", label="decode roofline")
        ax.set(ylabel="output tokens/s", title="output throughput")
        _log_x(ax, conc, "concurrency")
        ax.legend()
        ax = next(ax_iter)
        ax.plot(conc, [_nan(_stat(e, "tpot_ms", "median")) for e in thr], "o-", color="C1", label="TPOT")
        ax.set(ylabel="median TPOT (ms)", title="latency")
        _log_x(ax, conc, "concurrency")
        ax2 = ax.twinx()
        ax2.plot(conc, [_nan(_stat(e, "ttft_ms", "median")) for e in thr], "s--", color="C2", label="TTFT")
        ax2.set_ylabel("median TTFT (ms)")
        lines = ax.get_lines() + ax2.get_lines()
        ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left")
    if ttft:
        plen = [e["prompt_len"] for e in ttft]
        ax = next(ax_iter)
        ax.plot(plen, [_nan(_stat(e, "ttft_ms", "median")) for e in ttft], "o-", label="median")
        ax.plot(plen, [_nan(_stat(e, "ttft_ms", "p90")) for e in ttft], "^:", label="p90")
        if ttft[0]["ttft_floor_ms"] is not None:
            ax.plot(plen, [e["ttft_floor_ms"] for e in ttft], "k--", label="floor")
        ax.set(ylabel="TTFT (ms)", title="idle-server TTFT")
        _log_x(ax, plen, "prompt tokens")
        ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
