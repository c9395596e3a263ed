"""The HTTP part of time to first token that no engine can remove: a streamed completion answered at once.

Two stand-in servers under uvicorn, each in its own process, answer ``POST /v1/completions`` with one SSE token
chunk and ``[DONE]``: a plain ASGI callable (uvicorn's floor) and a FastAPI route with a StreamingResponse (the
framework hyserve serves with). The client, aiohttp as in ``hyserve bench``, times each request from the post to
its first data line, prompt of ``--prompt-len`` token ids; medians over ``--requests`` after 3 warm-up requests.
A second client, one blocking socket that sends the pre-encoded request in one write, times the same servers:
the difference is what the aiohttp client itself adds (building and writing the request, waking its event loop
for the answer), which ``hyserve bench`` and ``vllm bench serve`` both include in their time to first token.
The third server is hyserve's own (``hyserve.server``, the engine thread and scheduler included) over the
simulated device of ``scripts/sim_serving_host.py``: a step of SIM_STEP_MS, as a GPU's prefill would leave the
event loop time to finish its part of the answer meanwhile, and no input packing (a lone prompt's prefill
graph stages its inputs in ~0.06 ms). Its times are printed less the step: their excess over FastAPI's is what
hyserve's request path adds on this host.

usage: PYTHONPATH=src python scripts/http_floor.py [--prompt-len 128] [--requests 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

CHUNK = {
    "id": "x",
    "object": "text_completion",
    "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
}

SERVERS = {
    "plain ASGI": """
import json, sys, uvicorn
chunk = ("data: " + json.dumps({chunk}) + "\\n\\n").encode()
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body, more = b"", True
    while more:
        m = await receive()
        body, more = body + m.get("body", b""), m.get("more_body", False)
    json.loads(body)
    await send({{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}})
    await send({{"type": "http.response.body", "body": chunk, "more_body": True}})
    await send({{"type": "http.response.body", "body": b"data: [DONE]\\n\\n"}})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
""",
    "FastAPI": """
import json, sys, uvicorn
from fastapi import FastAPI, Request
from starlette.responses import StreamingResponse
app = FastAPI()
@app.post("/v1/completions")
async def completions(request: Request):
    await request.json()
    async def chunks():
        yield "data: " + json.dumps({chunk}) + "\\n\\n"
        yield "data: [DONE]\\n\\n"
    return StreamingResponse(chunks(), media_type="text/event-stream")
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
""",
}


SIM_STEP_MS = 5.0
HYSERVE = """
import asyncio, socket, sys
sys.path.insert(0, sys.argv[2])
from sim_serving_host import SimDevice, _model_dir
from hyserve.engine.llm_engine import EngineArgs, LLMEngine
from hyserve.server import ServerConfig
from hyserve.server.api import build_app
from hyserve.server.draining import build_server
args = EngineArgs(model=str(_model_dir(248320, 8192)), device="cpu", load_format="dummy", max_num_seqs=48,
                  max_model_len=8192, progress=False)
engine = LLMEngine(args)
engine.runner.launch = SimDevice(engine, {step}, {step}, 0.0).launch
engine.runner.prepare = lambda out, all_logits=False: None
config = ServerConfig(served_model_names=("m",), access_log=False)
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
sock.bind(("127.0.0.1", int(sys.argv[1])))
asyncio.run(build_server(build_app(engine, config), config, log_level="warning").serve(sockets=[sock]))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _body(prompt_len: int) -> dict:
    """A streamed completion of one token for a random prompt of ``prompt_len`` token ids."""
    return {
        "model": "m",
        "prompt": [random.randrange(1000) for _ in range(prompt_len)],
        "max_tokens": 1,
        "stream": True,
    }


async def _first_chunk_ms(port: int, prompt_len: int, requests: int) -> list[float]:
    body = _body(prompt_len)
    url = f"http://127.0.0.1:{port}/v1/completions"
    async with aiohttp.ClientSession() as session:
        for _ in range(600):  # until the server listens
            try:
                async with session.post(url, json=body) as r:
                    await r.read()
                break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
        times = []
        for _ in range(requests + 3):
            t0 = time.perf_counter()
            async with session.post(url, json=body) as r:
                async for line in r.content:
                    if line.startswith(b"data: ") and b"[DONE]" not in line:
                        times.append(1e3 * (time.perf_counter() - t0))
                        break
            await asyncio.sleep(0.02)  # an idle server between requests, as in the ttft scenario
        return times[3:]


def _first_chunk_ms_raw(port: int, prompt_len: int, requests: int) -> list[float]:
    """The same requests from a plain socket (keep-alive, TCP_NODELAY, the whole request in one write)."""
    body = json.dumps(_body(prompt_len)).encode()
    head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    request = f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    for _ in range(100):  # until the server listens
        try:
            sock = socket.create_connection(("127.0.0.1", port))
            break
        except ConnectionRefusedError:
            time.sleep(0.1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    with sock:
        for _ in range(requests + 3):
            t0 = time.perf_counter()
            sock.sendall(request)
            buf = b""
            while b"data: {" not in buf:
                buf += sock.recv(65536)
            times.append(1e3 * (time.perf_counter() - t0))
            while not buf.endswith(b"0\r\n\r\n"):  # the rest of the chunked answer, up to its last chunk
                buf += sock.recv(65536)
            time.sleep(0.02)
    return times[3:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--requests", type=int, default=60)
    ns = parser.parse_args()
    scripts = str(Path(__file__).resolve().parent)
    for name, source in [*SERVERS.items(), ("hyserve", HYSERVE)]:
        port = _free_port()
        code = source.format(chunk=CHUNK, step=SIM_STEP_MS)  # each source uses the names it has
        server = subprocess.Popen([sys.executable, "-c", code, str(port), scripts], stderr=subprocess.DEVNULL)
        try:
            times = asyncio.run(_first_chunk_ms(port, ns.prompt_len, ns.requests))
            raw = _first_chunk_ms_raw(port, ns.prompt_len, ns.requests)
        finally:
            server.terminate()
            server.wait()
        if name == "hyserve":
            times, raw = ([t - SIM_STEP_MS for t in ts] for ts in (times, raw))
            name = f"hyserve - {SIM_STEP_MS:g} ms"
        print(
            f"{name:>14}: first data line {statistics.median(times):.2f} ms median, {min(times):.2f} min (aiohttp); "
            f"{statistics.median(raw):.2f} median, {min(raw):.2f} min (socket)"
        )


if __name__ == "__main__":
    main()
