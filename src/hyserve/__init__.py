"""hyserve: an inference engine for Qwen3.5/3.6 (Gated DeltaNet + MoE) on NVIDIA H200."""

__version__ = "0.1.0"
