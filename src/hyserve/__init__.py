"""hyserve: an inference engine for Qwen3.5/3.6 (Gated DeltaNet + MoE) on NVIDIA H200.

The public names load lazily, so tools such as ``hyserve bench`` start without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "hyserve.llm",
    "SamplingParams": "hyserve.engine.sampling_params",
    "RequestOutput": "hyserve.engine.outputs",
    "CompletionOutput": "hyserve.engine.outputs",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hyserve' has no attribute {name!r}")
