"""The engine: scheduler (CPU-only) -> runner (device) -> sampler, driven by ``LLMEngine``."""
