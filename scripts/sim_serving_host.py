"""How much of a serving run the GPU would wait for the host, measured without a GPU.

The real HTTP server, engine loop, scheduler and decode-input staging run as in ``hyserve serve``; only the
model step is replaced by a simulated device: a step launched at time t starts when the device is free and
takes ``decode_ms(B)`` (+ ``prefill_us`` per prefill token for a mixed step), and reading its tokens sleeps
until it is done (as a CUDA sync releases the GIL). ``hyserve bench`` then runs against it in another
process. The report compares the wall time with the device's busy time: the difference is host overhead
(Python in the engine thread, the event loop's streaming, GIL hand-offs between them).

usage: python scripts/sim_serving_host.py [--concurrency 32 --num-prompts 64] [--switch-interval 0.005]
The default step costs are the H200's (docs/performance.md): 2.84 ms at B=1, 15.66 ms at B=32.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hyserve.engine.args import DEMO_MODEL
from hyserve.engine.cuda_graphs import stage_decode_inputs
from hyserve.engine.llm_engine import EngineArgs, LLMEngine
from hyserve.engine.runner import PendingStep, RunnerOutput
from hyserve.engine.sampler import DeviceSample
from hyserve.engine.scheduler import SchedulerOutput
from hyserve.server import ServerConfig
from hyserve.server.api import build_app
from hyserve.server.draining import build_server


@dataclass
class _SimPending(PendingStep):
    done_at: float = 0.0  # perf_counter seconds when the simulated device finishes this step

    def wait(self) -> RunnerOutput:
        time.sleep(max(0.0, self.done_at - time.perf_counter()))
        for seq in self.seqs:
            self.result.sampled[seq.seq_id] = 1000
        return self.result


@dataclass
class SimDevice:
    engine: LLMEngine
    b1_ms: float
    b32_ms: float
    prefill_us: float  # per prefill token in a mixed step
    free_at: float = 0.0
    busy: float = 0.0  # seconds of simulated device work
    steps: dict = field(default_factory=lambda: {"decode": 0, "mixed": 0})
    _rows: np.ndarray | None = None
    _tables: np.ndarray | None = None

    def decode_s(self, b: int) -> float:
        return (self.b1_ms + (self.b32_ms - self.b1_ms) * (b - 1) / 31) / 1e3

    def launch(self, out: SchedulerOutput, input_tokens: torch.Tensor | None = None, offset: int = 0):
        runner = self.engine.runner
        if out.is_decode:  # the host work of DecodeGraphs.run
            if self._rows is None:
                width = -(-self.engine.max_model_len // runner.cache_config.block_size)
                n = self.engine.args.max_num_seqs
                self._rows = np.zeros((5, n), dtype=np.int64)
                self._tables = np.zeros((n, width), dtype=np.int32)
            n = len(out.scheduled)
            stage_decode_inputs(
                out,
                self._rows[:, :n],
                self._tables[:n],
                runner.cache_config.block_size,
                runner.cache_config.num_blocks,
                runner.cache_config.num_state_slots,
                with_ids=input_tokens is None,
            )
            torch.from_numpy(self._tables[:n]).clone()  # stands in for the host-to-device copy's launch
            cost = self.decode_s(n)
            self.steps["decode"] += 1
        else:  # the host work of an eager step
            runner.prepare(out)
            prefill = sum(e.num_new_tokens for e in out.scheduled if e.num_new_tokens > 1)
            cost = self.decode_s(len(out.scheduled)) + prefill * self.prefill_us / 1e6
            self.steps["mixed"] += 1
        start = max(time.perf_counter(), self.free_at)
        self.free_at = start + cost
        self.busy += cost
        seqs = [e.seq for e in out.scheduled if e.sample]
        sampled = DeviceSample(torch.full((len(seqs),), 1000, dtype=torch.long)) if seqs else None
        return _SimPending(out, seqs, sampled, RunnerOutput({}, {}, {}), done_at=self.free_at)


def _model_dir(vocab: int, max_len: int) -> Path:
    """The demo model's shapes with the real vocabulary and length, no tokenizer (as the dummy bench)."""
    path = Path(tempfile.mkdtemp(prefix="hyserve-sim-"))
    config = json.loads((DEMO_MODEL / "config.json").read_text())
    config.update(vocab_size=vocab, max_position_embeddings=max_len)
    (path / "config.json").write_text(json.dumps(config))
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=48)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--b1-ms", type=float, default=2.84)
    parser.add_argument("--b32-ms", type=float, default=15.66)
    parser.add_argument("--prefill-us", type=float, default=35.0)
    parser.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval (s)")
    ns = parser.parse_args()
    if ns.switch_interval is not None:
        sys.setswitchinterval(ns.switch_interval)
    vocab = 248320
    args = EngineArgs(
        model=str(_model_dir(vocab, ns.max_model_len)),
        device="cpu",
        load_format="dummy",
        max_num_seqs=ns.max_num_seqs,
        max_model_len=ns.max_model_len,
        progress=False,
    )
    engine = LLMEngine(args)
    device = SimDevice(engine, ns.b1_ms, ns.b32_ms, ns.prefill_us)
    engine.runner.launch = device.launch
    config = ServerConfig(served_model_names=("sim",), access_log=False)
    app = build_app(engine, config)
    # proto IPPROTO_TCP, as uvicorn's own listener has: asyncio sets TCP_NODELAY only on such sockets, and
    # without it Nagle holds each SSE chunk until the client's delayed ACK (~40 ms) on a kept-alive connection
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = build_server(app, config, log_level="warning")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(server.serve(sockets=[sock])), daemon=True
    )
    thread.start()
    while not server.started:
        time.sleep(0.05)
    out_dir = tempfile.mkdtemp(prefix="hyserve-sim-bench-")
    cmd = [
        sys.executable, "-m", "hyserve", "bench", "--url", f"http://127.0.0.1:{port}", "--no-progress",
        "--scenario", "throughput", "--concurrency", str(ns.concurrency), "--num-prompts", str(ns.num_prompts),
        "--prompt-len", str(ns.prompt_len), "--output-len", str(ns.output_len), "--warmup", "0",
        "--vocab-size", str(vocab), "--out", out_dir,
    ]  # fmt: skip
    t0, busy0 = time.perf_counter(), device.busy
    bench = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    print(bench.stdout[-2500:], bench.stderr[-1500:])
    busy = device.busy - busy0
    print(
        f"switch interval {sys.getswitchinterval() * 1e3:.2f} ms; steps {device.steps}; wall {wall:.1f} s; "
        f"simulated device busy {busy:.1f} s ({100 * busy / wall:.0f}%); host-bound {wall - busy:.1f} s"
    )
    server.should_exit = True
    thread.join(10)


if __name__ == "__main__":
    main()
