"""Shared test setup: on a machine without a GPU, Triton kernels run in the interpreter."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
