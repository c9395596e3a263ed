"""GPU kernel time per step from a ``torch.profiler`` run, by kernel name (CUPTI reports each kernel of
a replayed CUDA graph, so this works on graph-replayed decode steps)."""

from __future__ import annotations

from collections import defaultdict

import torch


def kernel_times(prof: torch.profiler.profile, steps: int) -> list[tuple[str, float, float]]:
    """[(kernel name, launches per step, microseconds per step)], longest first."""
    per_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            row = per_name[ev.name]
            row[0] += 1
            row[1] += ev.device_time
    rows = [(name, count / steps, us / steps) for name, (count, us) in per_name.items()]
    return sorted(rows, key=lambda r: -r[2])


def print_kernel_table(rows: list[tuple[str, float, float]], step_ms: float, top: int) -> None:
    """The ``top`` longest kernels: launches and microseconds per step, share of a ``step_ms`` step."""
    print(f"{'launches':>8} {'us/step':>9} {'share':>6}  kernel")
    for name, launches, us in rows[:top]:
        print(f"{launches:8.1f} {us:9.1f} {us / (step_ms * 1e3):6.1%}  {name[:110]}")
