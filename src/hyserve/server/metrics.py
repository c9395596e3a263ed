"""Prometheus metrics, named and bucketed like vLLM's so existing dashboards keep working.

Each server owns its ``CollectorRegistry`` (several servers can live in one process, e.g. in tests). The
engine thread updates them; prometheus_client's metrics are thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hyserve.engine.outputs import RequestOutput
from hyserve.engine.scheduler import SchedulerOutput

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_TTFT_BUCKETS += (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_TPOT_BUCKETS += (20.0, 40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
_E2E_BUCKETS += (240.0, 480.0, 960.0, 1920.0, 7680.0)
_STEP_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
_STEP_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the engine thread publishes after every iteration, for readers on other threads."""

    num_running: int  # requests with a sequence in the running batch
    num_waiting: int  # requests not yet scheduled (or preempted)
    num_free_blocks: int  # KV blocks
    num_blocks: int
    num_free_slots: int  # DeltaNet state slots
    num_slots: int
    kv_cache_usage: float  # fraction of KV blocks in use, 0..1


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry).labels(model_name)

        self.running = gauge("hyserve:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("hyserve:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("hyserve:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).")
        self.free_blocks = gauge("hyserve:num_free_kv_blocks", "KV cache blocks not held by any sequence.")
        self.total_blocks = gauge("hyserve:num_kv_blocks", "KV cache blocks in all.")
        self.free_slots = gauge("hyserve:num_free_state_slots", "DeltaNet state slots not held.")
        self.total_slots = gauge("hyserve:num_state_slots", "DeltaNet state slots in all.")
        self.prompt_tokens = counter("hyserve:prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = counter("hyserve:generation_tokens", "Tokens generated.")
        self._success = Counter(
            "hyserve:request_success",
            "Requests finished normally.",
            labels + ["finished_reason"],
            registry=self.registry,
        )
        self._model_name = model_name
        self.aborted = counter("hyserve:request_abort", "Requests aborted (client gone or shutdown).")
        self.failed = counter("hyserve:request_failure", "Requests failed by an engine error.")
        self.preemptions = counter(
            "hyserve:num_preemptions", "Times a sequence lost its cache to make room and was recomputed."
        )
        self.ttft = histogram(
            "hyserve:time_to_first_token_seconds", "Arrival to first token, seconds.", _TTFT_BUCKETS
        )
        self.tpot = histogram(
            "hyserve:time_per_output_token_seconds",
            "Mean time between output tokens of a request, seconds.",
            _TPOT_BUCKETS,
        )
        self.e2e = histogram(
            "hyserve:e2e_request_latency_seconds", "Arrival to last token, seconds.", _E2E_BUCKETS
        )
        # per engine step, by kind: "decode" (one token per sequence: the CUDA-graph case) or "mixed"
        # (prefill tokens in it); where the time of a serving run goes
        self._step_seconds = Histogram(
            "hyserve:iteration_seconds",
            "Wall time of one engine step (with async scheduling: mostly the wait for the step whose tokens it "
            "returns), seconds.",
            labels + ["kind"],
            buckets=_STEP_BUCKETS,
            registry=self.registry,
        )
        self._step_tokens = Histogram(
            "hyserve:iteration_tokens",
            "Tokens computed by one engine step.",
            labels + ["kind"],
            buckets=_STEP_TOKEN_BUCKETS,
            registry=self.registry,
        )

    def set_engine_stats(self, stats: EngineStats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        self.free_blocks.set(stats.num_free_blocks)
        self.total_blocks.set(stats.num_blocks)
        self.free_slots.set(stats.num_free_slots)
        self.total_slots.set(stats.num_slots)

    def record_step(self, seconds: float, step: SchedulerOutput) -> None:
        kind = "decode" if step.is_decode else "mixed"
        self._step_seconds.labels(self._model_name, kind).observe(seconds)
        self._step_tokens.labels(self._model_name, kind).observe(step.num_tokens)

    def record_finished(self, out: RequestOutput) -> None:
        """Latencies and the finish reason of a request that has just finished normally."""
        m = out.metrics
        self._success.labels(self._model_name, out.outputs[0].finish_reason or "stop").inc()
        self.preemptions.inc(out.num_preemptions)
        if m.finished_time is not None:
            self.e2e.observe(max(0.0, m.finished_time - m.arrival_time))
        longest = max(len(c.token_ids) for c in out.outputs)
        if m.first_token_time is not None and m.finished_time is not None and longest > 1:
            self.tpot.observe(max(0.0, m.finished_time - m.first_token_time) / (longest - 1))

    def record_first_token(self, out: RequestOutput) -> None:
        m = out.metrics
        self.prompt_tokens.inc(len(out.prompt_token_ids))
        if m.first_token_time is not None:
            self.ttft.observe(max(0.0, m.first_token_time - m.arrival_time))

    def render(self) -> bytes:
        return generate_latest(self.registry)
