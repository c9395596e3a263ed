"""The profiler summary: per-kernel durations and the time each added to a one-stream timeline."""

from __future__ import annotations

from types import SimpleNamespace

from hyserve.bench.kernel_profile import _per_name, print_kernel_table


def _ev(name: str, start: float, end: float) -> SimpleNamespace:
    return SimpleNamespace(
        name=name, time_range=SimpleNamespace(start=start, end=end), device_time=end - start
    )


def test_added_time_sums_to_the_busy_timeline_with_overlap_and_gaps(capsys):
    # a: 0-10; b starts early (PDL) at 8, waits, ends 15; gap; c: 20-23; b again 22-30 (overlaps c)
    events = [_ev("a", 0, 10), _ev("b", 8, 15), _ev("c", 20, 23), _ev("b", 22, 30)]
    rows = {r[0]: r for r in _per_name(reversed(events), steps=1)}
    assert rows["b"][1] == 2 and rows["b"][2] == 7 + 8  # durations include the early start
    assert rows["a"][3] == 10 and rows["b"][3] == 5 + 7 and rows["c"][3] == 3
    assert sum(r[3] for r in rows.values()) == 30 - 5  # the timeline minus the idle gap 15-20
    print_kernel_table(list(rows.values()), step_ms=0.03, top=5)
    assert "added us" in capsys.readouterr().out


def test_by_predecessor_splits_one_kernel_by_the_kernel_before_it():
    events = [_ev("moe_down", 0, 4), _ev("gemv", 4, 10), _ev("gdn_step", 10, 12), _ev("gemv", 12, 15)]
    rows = {r[0]: r for r in _per_name(events, steps=1, by_predecessor=("gemv",))}
    assert rows["gemv <- moe_down"][1:] == (1, 6, 6) and rows["gemv <- gdn_step"][1:] == (1, 3, 3)
    assert "gemv" not in rows and rows["gdn_step"][3] == 2
