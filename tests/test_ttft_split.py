"""``scripts/ttft_split.py`` reads the server's own histograms by name: those names and the deltas it takes are
checked here against what ``ServerMetrics`` renders, so a renamed metric fails here, not as NaN on the device."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from hyserve.engine.scheduler import SchedulerOutput
from hyserve.server.metrics import ServerMetrics

_SPEC = importlib.util.spec_from_file_location(
    "ttft_split", Path(__file__).resolve().parents[1] / "scripts" / "ttft_split.py"
)
ttft_split = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ttft_split)


def test_the_split_reads_the_means_of_what_the_server_observed_between_two_reads() -> None:
    m = ServerMetrics("model-a")
    m.ttft.observe(0.5)  # before the first read: not in the delta
    m.record_step(0.25, SchedulerOutput())
    before = ttft_split.parse_metrics(m.render().decode())
    for seconds in (0.020, 0.030):
        m.ttft.observe(seconds)
    for seconds in (0.010, 0.012, 0.014):
        m.record_step(seconds, SchedulerOutput())  # no scheduled sequence: a "mixed" step
    after = ttft_split.parse_metrics(m.render().decode())

    server = ttft_split.delta_mean_ms(before, after, "hyserve:time_to_first_token_seconds")
    step = ttft_split.delta_mean_ms(before, after, "hyserve:iteration_seconds", "mixed")
    assert math.isclose(server, 25.0, rel_tol=1e-9)
    assert math.isclose(step, 12.0, rel_tol=1e-9)
    assert math.isnan(ttft_split.delta_mean_ms(before, after, "hyserve:iteration_seconds", "decode"))


def test_parse_keeps_labels_apart_and_skips_other_lines() -> None:
    text = "\n".join(
        [
            "# HELP hyserve:iteration_seconds Engine step time.",
            'hyserve:iteration_seconds_sum{kind="mixed",model_name="m"} 2.0',
            'hyserve:iteration_seconds_count{kind="mixed",model_name="m"} 4.0',
            'hyserve:iteration_seconds_sum{kind="decode",model_name="m"} 9.0',
            'hyserve:iteration_seconds_count{kind="decode",model_name="m"} 3.0',
            "process_cpu_seconds_total 1.5",
        ]
    )
    sample = ttft_split.parse_metrics(text)
    assert len(sample) == 4
    zero = {k: 0.0 for k in sample}
    assert ttft_split.delta_mean_ms(zero, sample, "hyserve:iteration_seconds", "mixed") == 500.0
    assert ttft_split.delta_mean_ms(zero, sample, "hyserve:iteration_seconds", "decode") == 3000.0
