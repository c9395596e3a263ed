"""Where the server's host time to first token goes, without a GPU: the real FastAPI app, engine thread and
scheduler in process over ``sim_serving_host``'s simulated device (a zero-time step), driven through httpx's
ASGI transport (no sockets, no uvicorn). Each streamed completion request (token ids, ``max_tokens=1``) is
timed from the request to stage marks: the handler's ``add`` (parsing, validation, admission), the engine
thread taking the command (the hand-off), the step's start and end, the event loop's dispatch and the first
SSE line. Prints the median of each mark over ``--requests`` requests. The simulated step packs its inputs
the eager way (``runner.prepare``, ~1.4 ms at 1024 tokens here); on a GPU a lone prompt takes the prefill graph's
staging instead (~0.05 ms), so marks 3-4 overstate the host's step there.

With ``--model`` (a model folder; dummy weights) the same marks come from the real engine on its device
(the GPU where there is one: the step is then the real prefill, a graph replay for a lone prompt), which
splits the HTTP part of the time to first token on the H200 into the same stages.

usage: python scripts/host_ttft_timeline.py [--prompt-len 1024] [--requests 80] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

import httpx
from sim_serving_host import SimDevice, _model_dir

from hyserve.engine.llm_engine import EngineArgs, LLMEngine
from hyserve.server import ServerConfig
from hyserve.server import async_engine as ae
from hyserve.server.api import build_app

MARKS: dict[str, float] = {}


def _mark(cls: type, name: str, label: str, after: bool = False) -> None:
    """Record the first call of ``cls.name`` in a request (its start, or its return with ``after``)."""
    f = getattr(cls, name)

    def wrapped(*args, **kwargs):
        if not after:
            MARKS.setdefault(label, time.perf_counter())
        out = f(*args, **kwargs)
        if after:
            MARKS.setdefault(label, time.perf_counter())
        return out

    setattr(cls, name, wrapped)


async def _run(app, prompt_len: int, requests: int) -> list[dict[str, float]]:
    bodies = [
        json.dumps(
            {
                "model": "sim",
                "prompt": [random.randrange(240000) for _ in range(prompt_len)],
                "max_tokens": 1,
                "stream": True,
                "ignore_eos": True,
            }  # fmt: skip
        ).encode()
        for _ in range(requests + 5)
    ]
    rows = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            for body in bodies:
                MARKS.clear()
                t0 = time.perf_counter()
                headers = {"content-type": "application/json"}
                async with client.stream("POST", "/v1/completions", content=body, headers=headers) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data:"):
                            MARKS["6 first SSE line"] = time.perf_counter()
                            break
                rows.append({k: (v - t0) * 1e3 for k, v in MARKS.items()})
    return rows[5:]  # the first ones warm up


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=80)
    parser.add_argument("--model", help="a model folder: the real engine on its device (dummy weights)")
    ns = parser.parse_args()
    vocab, max_len = 248320, 8192
    if ns.model:
        args = EngineArgs(model=ns.model, load_format="dummy", max_num_seqs=48, max_model_len=max_len,
                          gpu_memory_utilization=0.95, progress=False)  # fmt: skip
    else:
        args = EngineArgs(model=str(_model_dir(vocab, max_len)), device="cpu", load_format="dummy",
                          max_num_seqs=48, max_model_len=max_len, progress=False)  # fmt: skip
    engine = LLMEngine(args)
    if not ns.model:
        engine.runner.launch = SimDevice(engine, 0.001, 0.001, 0.0).launch
    app = build_app(engine, ServerConfig(served_model_names=("sim",), access_log=False))
    _mark(ae.AsyncEngine, "add", "1 handler's add()")
    _mark(ae.AsyncEngine, "_handle", "2 engine thread takes it")
    _mark(LLMEngine, "step", "3 step starts")
    _mark(LLMEngine, "step", "4 step ends", after=True)
    _mark(ae.AsyncEngine, "_dispatch", "5 event loop dispatches")
    rows = asyncio.run(_run(app, ns.prompt_len, ns.requests))
    print(f"prompt {ns.prompt_len} token ids, {len(rows)} requests: ms from the request, median")
    for label in sorted(rows[0]):
        print(f"  {label:28s} {statistics.median(r[label] for r in rows):7.3f}")


if __name__ == "__main__":
    main()
