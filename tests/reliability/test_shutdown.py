"""SIGTERM during 8 streams and 4 non-streaming requests (collected last: it ends the suite's server).

Every client gets its complete answer or a proper error (stream: an error event then ``[DONE]``;
non-stream: a JSON 503) within ``--shutdown-timeout``; a new request meanwhile gets 503 with
``Retry-After``; the server exits 0 and leaves no engine-core process behind.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx

from tests.reliability.helpers import SERVER_ARGS, tracebacks

SHUTDOWN_TIMEOUT_S = float(SERVER_ARGS[SERVER_ARGS.index("--shutdown-timeout") + 1])


async def _stream(client: httpx.AsyncClient, max_tokens: int) -> tuple[str, object]:
    events = []
    async with client.stream("POST", "/v1/completions", json={"prompt": "Tell me a story", "stream": True,
                                                              "max_tokens": max_tokens, "ignore_eos": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events and events[-1] == "[DONE]", events[-3:]
    last = json.loads(events[-2])
    if "error" in last:
        assert last["error"]["code"] == 503 and last["error"]["message"], last
        return "error", last["error"]["code"]
    assert last["choices"][0]["finish_reason"] == "length", last
    return "complete", len(events) - 1


async def _plain(client: httpx.AsyncClient, max_tokens: int) -> tuple[str, object]:
    r = await client.post("/v1/completions", json={"prompt": "Tell me a story", "max_tokens": max_tokens,
                                                   "ignore_eos": True})
    if r.status_code == 200:
        assert r.json()["usage"]["completion_tokens"] == max_tokens
        return "complete", max_tokens
    assert r.status_code == 503 and r.json()["error"]["message"], r.text
    return "error", 503


def _alive(pids: list[int]) -> list[int]:
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_sigterm_mid_stream_finishes_or_errors_everyone(server):
    traces_before = tracebacks(server)
    core_pids = [p.pid for p in server.children()]

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            # half finish well inside the timeout, half cannot: both outcomes are exercised
            tasks = [asyncio.ensure_future(_stream(client, 3 if i % 2 else 400)) for i in range(8)]
            tasks += [asyncio.ensure_future(_plain(client, 3 if i % 2 else 400)) for i in range(4)]
            await asyncio.sleep(1.5)
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as fresh:
                late = await fresh.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
            results = await asyncio.gather(*tasks)
            return late, results, time.monotonic() - t0

    late, results, elapsed = asyncio.run(run())
    assert late.status_code == 503 and "retry-after" in late.headers
    assert elapsed < SHUTDOWN_TIMEOUT_S + 5, elapsed
    kinds = [k for k, _ in results]
    assert "error" in kinds and "complete" in kinds, results
    assert server.proc.wait(30) == 0
    deadline = time.monotonic() + 10  # the core and multiprocessing's resource tracker follow within moments
    while _alive(core_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(core_pids)
    assert tracebacks(server) == traces_before
