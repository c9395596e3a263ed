"""GPU kernel time per step from a ``torch.profiler`` run, by kernel name (CUPTI reports each kernel of
a replayed CUDA graph, so this works on graph-replayed decode steps).

Two times per kernel. Its duration, which under programmatic dependent launch (``kernels/pdl.py``) includes
the time it spent started but waiting for the kernel before it, so durations then sum to more than the step.
And the time it added to the stream's timeline: its end minus the later of its start and the previous
kernel's end. Those sum to the busy time of a single-stream step (the decode graph), with or without PDL,
and say which kernels the step's time is spent finishing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch


def kernel_times(
    prof: torch.profiler.profile, steps: int, by_predecessor: tuple[str, ...] = ()
) -> list[tuple[str, float, float, float]]:
    """[(kernel name, launches per step, microseconds per step, microseconds added per step)], longest
    first. The device events are taken in start order as one stream (what a decode graph replay is).
    Kernels whose name contains one of ``by_predecessor`` are tallied per kernel launched before them, as
    "name <- predecessor" (one kernel serving several ops, e.g. the GEMV of in_proj after the MoE and of
    out_proj after the DeltaNet step)."""
    return _per_name(
        (
            ev
            for ev in prof.events()
            if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0
        ),
        steps,
        by_predecessor,
    )


def _per_name(
    events: Iterable, steps: int, by_predecessor: tuple[str, ...] = ()
) -> list[tuple[str, float, float, float]]:
    per_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    prev_end = None
    prev_name = "start"
    for ev in sorted(events, key=lambda e: e.time_range.start):
        start, end = ev.time_range.start, ev.time_range.end
        added = end - (start if prev_end is None else max(prev_end, start))
        prev_end = end if prev_end is None else max(prev_end, end)
        name = ev.name
        if any(part in name for part in by_predecessor):
            name = f"{name[:40]} <- {prev_name[:60]}"
        prev_name = ev.name
        row = per_name[name]
        row[0] += 1
        row[1] += ev.device_time
        row[2] += max(added, 0.0)
    rows = [(name, count / steps, us / steps, added / steps) for name, (count, us, added) in per_name.items()]
    return sorted(rows, key=lambda r: -r[2])


def print_kernel_table(rows: list[tuple], step_ms: float, top: int) -> None:
    """The ``top`` longest kernels: launches and microseconds per step, share of a ``step_ms`` step, and
    (when the rows have it) the microseconds each added to the timeline per step."""
    added = len(rows[0]) > 3 if rows else False
    print(
        f"{'launches':>8} {'us/step':>9} {'share':>6}" + (f" {'added us':>9}" if added else "") + "  kernel"
    )
    for row in rows[:top]:
        name, launches, us = row[:3]
        extra = f" {row[3]:9.1f}" if added else ""
        print(f"{launches:8.1f} {us:9.1f} {us / (step_ms * 1e3):6.1%}{extra}  {name[:110]}")
