"""``hyserve bench``: a load generator for any OpenAI-compatible server (hyserve, vLLM, SGLang).

Modules: :mod:`~hyserve.bench.client` (one timed streaming request), :mod:`~hyserve.bench.scenarios`
(decode / ttft / throughput levels, closed-loop runner), :mod:`~hyserve.bench.report` (statistics, table,
plot), :mod:`~hyserve.bench.roofline` (decode/prefill floors from a config.json), :mod:`~hyserve.bench.cli`
(arguments and driver).
"""

from hyserve.bench.cli import add_bench_arguments, run_bench

__all__ = ["add_bench_arguments", "run_bench"]
