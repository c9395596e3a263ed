"""Nothing leaks: clients that leave mid-stream free their cache within a step, and a long mixed workload
with random cancellations leaves no engine request, cache block, state slot, asyncio task or thread."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import threading
import time

import httpx
import pytest

from server_harness import BackgroundServer, text_checkpoint


@pytest.fixture(autouse=True)
def no_errors_logged(caplog):
    """Whatever the clients do here, the server must not log an error (e.g. a traceback it survived)."""
    caplog.set_level(logging.WARNING)
    yield
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(text_checkpoint()) as s:
        yield s


def _assert_all_free(server: BackgroundServer) -> None:
    server.wait_idle()
    cache = server.engine.cache_manager
    m = server.metrics()
    assert m["hyserve:num_free_kv_blocks"] == m["hyserve:num_kv_blocks"] == cache.config.num_blocks
    assert m["hyserve:num_free_state_slots"] == m["hyserve:num_state_slots"] == cache.config.num_state_slots
    assert m["hyserve:num_requests_running"] == m["hyserve:num_requests_waiting"] == 0
    assert m["hyserve:kv_cache_usage_perc"] == 0.0
    assert (
        not server.engine.requests
        and not server.engine.scheduler.running
        and not server.engine.scheduler.waiting
    )


def _body(rng: random.Random, endpoint: str, **extra) -> dict:
    if endpoint == "completions":
        return {"prompt": rng.choice(["Hello", "The quick brown fox", [5, 6, 7, 8, 9]]), **extra}
    return {"messages": [{"role": "user", "content": rng.choice(["hi", "tell me more"])}], **extra}


def test_aborted_streams_free_every_block_and_slot(server):
    before = server.metrics()["hyserve:request_abort_total"]
    rng = random.Random(0)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        endpoint = "completions" if i % 2 else "chat/completions"
        body = _body(rng, endpoint, max_tokens=200, ignore_eos=True, stream=True, n=1 + i % 3)
        wanted = rng.randint(2, 6)
        async with client.stream("POST", f"/v1/{endpoint}", json=body) as r:
            assert r.status_code == 200
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen >= wanted:
                    break  # leaving the block closes the connection mid-stream

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            await asyncio.gather(*(one(client, i) for i in range(50)))

    asyncio.run(run())
    _assert_all_free(server)
    assert server.metrics()["hyserve:request_abort_total"] - before == 50


def test_soak_mixed_requests_with_cancellations_leaks_nothing(server):
    """500 short requests of every kind, a quarter of them abandoned at a random moment."""
    rng = random.Random(1)
    with httpx.Client(base_url=server.url) as c:  # warm up every code path once
        c.post("/v1/completions", json={"prompt": "warm", "max_tokens": 2})
    _assert_all_free(server)
    threads, tasks = threading.active_count(), server.num_tasks()
    aborts = server.metrics()["hyserve:request_abort_total"]
    outcomes = {"ok": 0, "cancelled": 0, "rejected": 0}

    def params() -> dict:
        p: dict = {"max_tokens": rng.randint(1, 8), "n": rng.choice([1, 1, 2])}
        p["temperature"] = rng.choice([0.0, 0.7, 1.0])
        if rng.random() < 0.3:
            p["seed"] = rng.randint(0, 1000)
        if rng.random() < 0.2:
            p["stop"] = [rng.choice(["e", " t", "o"])]
        if rng.random() < 0.2:
            p["top_k"], p["top_p"] = 10, 0.9
        if rng.random() < 0.1:
            p["repetition_penalty"] = 1.2
        return p

    async def one(client: httpx.AsyncClient, sem: asyncio.Semaphore) -> None:
        endpoint = rng.choice(["completions", "chat/completions"])
        p = params()
        if endpoint == "completions" and rng.random() < 0.2:
            p |= {"logprobs": 2, "echo": rng.random() < 0.5}
        if endpoint == "chat/completions" and rng.random() < 0.2:
            p |= {"logprobs": True, "top_logprobs": 2}
        stream = rng.random() < 0.5
        if stream and rng.random() < 0.5:
            p["stream_options"] = {"include_usage": True}
        body = _body(rng, endpoint, stream=stream, **p)
        if rng.random() < 0.04:
            body["temperature"] = -1.0  # a bad one now and then
        cancel_after = rng.uniform(0.0, 0.3) if rng.random() < 0.25 else None
        async with sem:
            work = asyncio.ensure_future(_request(client, endpoint, body, stream))
            if cancel_after is not None:
                await asyncio.sleep(cancel_after)
                work.cancel()
            try:
                status = await work
            except asyncio.CancelledError:
                outcomes["cancelled"] += 1
                return
            outcomes["ok" if status == 200 else "rejected"] += 1
            assert status in (200, 400), status

    async def run() -> None:
        sem = asyncio.Semaphore(32)
        limits = httpx.Limits(max_connections=40)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            await asyncio.gather(*(one(client, sem) for _ in range(500)))

    asyncio.run(run())
    assert outcomes["ok"] > 250 and outcomes["cancelled"] > 50 and outcomes["rejected"] > 5, outcomes
    _assert_all_free(server)
    assert server.async_engine.num_unfinished == 0
    assert server.metrics()["hyserve:request_abort_total"] > aborts  # cancellations reached the engine
    deadline = time.monotonic() + 10  # connections the clients dropped close asynchronously
    while (server.num_tasks(), threading.active_count()) != (tasks, threads) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.num_tasks() == tasks
    assert threading.active_count() == threads


async def _request(client: httpx.AsyncClient, endpoint: str, body: dict, stream: bool) -> int:
    if not stream:
        r = await client.post(f"/v1/{endpoint}", json=body)
        return r.status_code
    async with client.stream("POST", f"/v1/{endpoint}", json=body) as r:
        lines = [line async for line in r.aiter_lines() if line]
    if r.status_code == 200:
        assert lines[-1] == "data: [DONE]"
    return r.status_code


def test_a_client_that_stops_reading_does_not_stall_generation(server):
    """A client that reads nothing: its request still runs to the end at full speed (only the newest
    output waits for it), another request is served meanwhile, and it gets every token when it reads."""
    body = {"prompt": "slow reader", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "logprobs": 5}
    expected = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    payload = json.dumps(body | {"stream": True, "echo": True}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fill up fast
    sock.connect(("127.0.0.1", server.port))
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    sock.sendall(head.encode() + payload)
    try:
        deadline = time.monotonic() + 60
        while server.async_engine.num_unfinished == 0:  # admitted
            assert time.monotonic() < deadline
            time.sleep(0.01)
        other = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": "meanwhile", "max_tokens": 4}, timeout=60
        )
        assert other.status_code == 200
        while server.engine.requests:  # the unread request finishes generating all the same
            assert time.monotonic() < deadline, "generation stalled behind a client that does not read"
            time.sleep(0.01)
        raw = b""
        sock.settimeout(30)
        while not raw.endswith(b"\r\n0\r\n\r\n"):  # the last chunk of a chunked body
            chunk = sock.recv(65536)
            if not chunk:
                break
            raw += chunk
    finally:
        sock.close()
    lines = raw.decode().splitlines()  # chunk-size lines interleave; every event is a chunk of its own
    assert "data: [DONE]" in lines
    events = [line[6:] for line in lines if line.startswith("data: {")]
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events)
    assert text.endswith(expected) and len(text) > len(expected)  # echo put the prompt in front
    _assert_all_free(server)
