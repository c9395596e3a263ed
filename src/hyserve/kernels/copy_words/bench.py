"""Micro-benchmark of copy_words against the copy engine, as a decode step uses them (H200).

``python -m hyserve.kernels.copy_words.bench``: a step's staging in (pinned host -> device) and its tokens out
(device -> pinned host), queued back to back, 50 such pairs captured in a CUDA graph so that the host's launch
time is not measured; prints the median device time per pair over 20 replays, through ``copy_words`` and
through ``Tensor.copy_(non_blocking=True)`` (a copy-engine ``cudaMemcpyAsync``). What counts is the latency of
small dependent operations, not bandwidth: the bytes are a batch-1 step's (4160 in, 8 out) and a batch-48 one's.
"""

from __future__ import annotations

import torch

from hyserve.kernels.copy_words import copy_words

PAIRS = 50


def bench(staging_bytes: int, token_bytes: int, replays: int = 20) -> dict:
    host_in = torch.randint(0, 100, (staging_bytes,), dtype=torch.uint8).pin_memory()
    dev_in = torch.empty(staging_bytes, dtype=torch.uint8, device="cuda")
    dev_out = torch.randint(0, 100, (token_bytes // 8,), dtype=torch.int64, device="cuda")
    host_out = torch.empty(token_bytes // 8, dtype=torch.int64).pin_memory()

    def kernel():
        copy_words(host_in, dev_in)
        copy_words(dev_out, host_out)

    def engine():
        dev_in.copy_(host_in, non_blocking=True)
        host_out.copy_(dev_out, non_blocking=True)

    out = {"staging_B": staging_bytes, "tokens_B": token_bytes}
    for name, fn in (("kernel", kernel), ("copy_engine", engine)):
        fn()  # compiles outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(PAIRS):
                fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(replays):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / PAIRS)
        out[f"{name}_us"] = sorted(times)[len(times) // 2]
    assert torch.equal(dev_in.cpu(), host_in) and torch.equal(host_out, dev_out.cpu())
    return out


def run() -> list[dict]:
    return [bench(4160, 8), bench(44 * 48 + 4 * 512 * 48, 48 * 8)]


def main() -> None:
    for r in run():
        print("  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
