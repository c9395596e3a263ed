"""Workspace allocation for the Triton MoE path; tests set ``POISON`` so stale reads show up."""

from __future__ import annotations

import torch

from hyserve.kernels.pdl import launch_options

POISON = False  # fill new buffers with NaN (floats) / a huge id (ints) instead of leaving them empty


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    if POISON:
        t.fill_(float("nan") if dtype.is_floating_point else 1 << 30)
    return t


WARMUP_ONLY = False  # tune.py's compile workers: compile every launch into the cache, run nothing


def launch(kernel, grid: tuple[int, ...], *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, or only its compilation when ``WARMUP_ONLY``; a kernel taking
    ``USE_PDL`` launches with programmatic dependent launch where the device has it (``kernels/pdl.py``)."""
    if "USE_PDL" in kernel.arg_names and "USE_PDL" not in kwargs:
        kwargs.update(launch_options(next(a for a in args if isinstance(a, torch.Tensor))))
    if WARMUP_ONLY:
        kernel.warmup(*args, grid=grid, **kwargs)
    else:
        kernel[grid](*args, **kwargs)
