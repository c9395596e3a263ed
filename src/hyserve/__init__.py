"""hyserve: an inference engine for Qwen3.5/3.6 (Gated DeltaNet + MoE) on NVIDIA H200."""

from hyserve.engine.outputs import CompletionOutput, RequestOutput
from hyserve.engine.sampling_params import SamplingParams
from hyserve.llm import LLM

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "__version__"]

__version__ = "0.1.0"
