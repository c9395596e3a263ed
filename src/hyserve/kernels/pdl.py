"""Programmatic dependent launch (PDL, Hopper and later) for the Triton kernels of the decode step.

A graph-replayed decode step at batch 1 is ~390 kernels of 2-13 us. Without PDL a kernel's programs are
scheduled only once the previous kernel of the stream has retired, so every kernel pays its ramp-up (launch,
first loads in flight) in series with the previous one's tail. Launched with ``launch_pdl=True``, its
programs are scheduled as soon as every program of the previous kernel has called
``griddepcontrol.launch_dependents`` (or exited), and block at ``griddepcontrol.wait`` until that kernel
has completed and its memory is visible.

The contract of a kernel taking ``USE_PDL: tl.constexpr``: it calls ``wait_for_previous(USE_PDL)`` before
its first store and before loading anything the previous kernel may write. The release comes right after
the wait, so a kernel lets its successor start only once its own predecessor has completed: at most two
kernels are resident at a time, and every kernel still sees the writes of all kernels before it. Before
the wait a kernel may load what no kernel writes (weights; the step's inputs, copied in before its first
kernel) and what kernels at least two launches back wrote (they completed before the previous kernel passed
its wait): the GEMV, the router and the MoE down kernel stream their first weight tiles there, the DeltaNet
step its state tile, the paged decode attention its sequence lengths and block ids, so their ramp-up
overlaps the previous kernel's tail. Kernels launched without the attribute (cuBLAS,
torch) keep the plain stream order, before and after. Under CUDA graphs the attribute becomes a
programmatic edge of the captured graph.

``HYSERVE_PDL=0`` turns it off (A/B timing); the CPU interpreter never uses it.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@triton.jit
def wait_for_previous(USE_PDL: tl.constexpr):
    """Block until the previous kernel of the stream completed, then let the next one be scheduled."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@functools.cache
def _supported(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def enabled(t: torch.Tensor) -> bool:
    """Whether kernels on t's device launch with PDL: CUDA, compute capability >= 9, not HYSERVE_PDL=0."""
    if not t.is_cuda or os.environ.get("HYSERVE_PDL", "1") == "0":
        return False
    return _supported(t.device.index if t.device.index is not None else torch.cuda.current_device())


def launch_options(t: torch.Tensor) -> dict[str, bool]:
    """The keyword arguments of a launch of a ``USE_PDL`` kernel on t's device."""
    on = enabled(t)
    return {"USE_PDL": on, "launch_pdl": on}
