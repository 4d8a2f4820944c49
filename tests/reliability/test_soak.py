"""The long checks (``make reliability`` only): a server that trusts request templates under a
pathological one, a mixed soak with a memory bound, and a kill of the engine core under load."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import httpx
import psutil
import pytest

from octavo.server.launch import ServerProcess
from tests.reliability.helpers import FULL, SERVER_ARGS

pytestmark = pytest.mark.skipif(not FULL, reason="soak: run with `make reliability` (OCTAVO_RELIABILITY=full)")

EVIL = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
M = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def trusted(tmp_path_factory):
    log = tmp_path_factory.mktemp("soak") / "server.log"
    with ServerProcess([*SERVER_ARGS, "--trust-request-chat-template"], log_path=str(log),
                       startup_timeout_s=600) as srv:
        yield srv


def test_pathological_template_is_stopped_and_does_not_stall(trusted):
    result = {}

    def attack() -> None:
        t = time.perf_counter()
        r = httpx.post(trusted.url + "/v1/chat/completions", json={"messages": M, "chat_template": EVIL}, timeout=60)
        result.update(status=r.status_code, param=r.json()["error"]["param"], s=time.perf_counter() - t)

    busy = threading.Thread(target=attack)
    busy.start()
    health, small = [], []
    with httpx.Client(base_url=trusted.url, timeout=30) as c:
        time.sleep(0.3)
        while busy.is_alive():
            t = time.perf_counter()
            c.get("/health")
            health.append(time.perf_counter() - t)
            t = time.perf_counter()
            c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
            small.append(time.perf_counter() - t)
            time.sleep(0.05)
    assert result["status"] == 400 and result["param"] == "chat_template" and result["s"] < 20
    health.sort()
    small.sort()
    print(f"during a runaway template: /health p50 {health[len(health) // 2] * 1e3:.1f} ms, max "
          f"{health[-1] * 1e3:.1f} ms; 1-token completion p50 {small[len(small) // 2] * 1e3:.1f} ms, max "
          f"{small[-1] * 1e3:.1f} ms ({len(health)} probes)")


def test_mixed_soak_memory_bounded(trusted):
    """Three minutes of mixed traffic (valid, invalid, streams, disconnects): the front end's memory stays flat."""
    proc = psutil.Process(trusted.proc.pid)
    rss0 = proc.memory_info().rss
    deadline = time.monotonic() + 180
    rng = random.Random(0)

    async def worker(i: int) -> None:
        async with httpx.AsyncClient(base_url=trusted.url, timeout=httpx.Timeout(30)) as c:
            while time.monotonic() < deadline:
                kind = rng.randrange(4)
                body = {"prompt": "Tell me about cats", "max_tokens": rng.randint(1, 16), "stream": kind == 1}
                if kind == 2:
                    body["max_tokens"] = 2**70
                try:
                    if kind == 3:
                        async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                            async for _ in r.aiter_lines():
                                break  # leave mid-stream
                    else:
                        r = await c.post("/v1/completions", json=body)
                        assert r.status_code < 500, r.text
                except httpx.TransportError:
                    pass

    async def run():
        await asyncio.gather(*(worker(i) for i in range(8)))

    asyncio.run(run())
    grew = (proc.memory_info().rss - rss0) / 2**20
    print(f"front-end RSS grew {grew:.0f} MiB over the soak")
    assert grew < 200


def test_core_kill_under_load_fails_everyone(trusted):
    core = [c for c in trusted.children() if "resource_tracker" not in " ".join(c.cmdline())]

    async def one(c: httpx.AsyncClient, stream: bool) -> int:
        body = {"prompt": "Count to a thousand", "max_tokens": 300, "ignore_eos": True, "stream": stream}
        if stream:
            async with c.stream("POST", "/v1/completions", json=body) as r:
                lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]" and '"error"' in lines[-2]
            return 503
        r = await c.post("/v1/completions", json=body)
        return r.status_code

    async def run():
        async with httpx.AsyncClient(base_url=trusted.url, timeout=60) as c:
            tasks = [asyncio.ensure_future(one(c, i < 6)) for i in range(9)]
            await asyncio.sleep(2)
            core[0].kill()
            return await asyncio.wait_for(asyncio.gather(*tasks), 30)

    assert set(asyncio.run(run())) == {503}
