"""End to end, the unhappy paths of a real ``octavo serve``: API key, overload (503 + Retry-After), and the
engine core dying under load (``/health`` 503 within a second, in-flight requests fail instead of hanging,
new ones get 503, the server exits non-zero and leaves no child behind).

The core-death test must run last: it ends the module's server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import httpx
import openai
import psutil
import pytest

from octavo.server.launch import ServerProcess

pytestmark = pytest.mark.slow

KEY = "s3cret-key"


# --chat-template FILE overrides the model's template for every chat request
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\nCUSTOM:{% endif %}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    template = tmp_path_factory.mktemp("tpl") / "chat.jinja"
    template.write_text(TEMPLATE)
    srv = ServerProcess(["--max-model-len", "256", "--kv-cache-memory-bytes", str(64 << 20), "--api-key", KEY,
                         "--max-queue-len", "1", "--max-num-seqs", "2", "--chat-template", str(template),
                         "--uvicorn-log-level", "warning"]).start()
    yield srv
    srv.stop()


def _auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_api_key(server):
    assert httpx.get(server.url + "/health").status_code == 200  # no key needed
    for headers in ({}, _auth("wrong"), {"Authorization": KEY}):
        r = httpx.get(server.url + "/v1/models", headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key" and r.json()["error"]["type"]
    for path in ("/metrics", "/version"):
        assert httpx.get(server.url + path).status_code == 401
    assert httpx.post(server.url + "/v1/completions", json={"prompt": "hi"}).status_code == 401
    assert httpx.get(server.url + "/v1/models", headers=_auth()).status_code == 200
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model=client.models.list().data[0].id, prompt="Hi", max_tokens=2).usage


def test_chat_template_file(server):
    msgs = [{"role": "user", "content": "Hi"}]
    ids = httpx.post(server.url + "/tokenize", json={"messages": msgs}, headers=_auth()).json()["tokens"]
    text = httpx.post(server.url + "/detokenize", json={"tokens": ids}, headers=_auth()).json()["prompt"]
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nCUSTOM:"
    r = httpx.post(server.url + "/v1/chat/completions", headers=_auth(),
                   json={"messages": msgs, "max_tokens": 2, "temperature": 0}).json()
    assert r["usage"]["prompt_tokens"] == len(ids)


def test_overload_answers_503_with_retry_after(server):
    body = {"prompt": "Tell me a story about a dragon.", "max_tokens": 8, "ignore_eos": True}

    def post(_: int) -> httpx.Response:
        return httpx.post(server.url + "/v1/completions", json=body, headers=_auth(), timeout=120)

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(post, range(12)))
    codes = [r.status_code for r in responses]
    assert 200 in codes and 503 in codes, codes
    assert set(codes) <= {200, 503}
    for r in responses:
        if r.status_code == 503:
            assert r.headers["Retry-After"] == "1"
            assert r.json()["error"]["type"] == "service_unavailable_error"
        else:
            assert r.json()["usage"]["completion_tokens"] == 8
    # the queue drained: a lone request is served again
    assert post(0).status_code == 200


def test_core_death_fails_requests_and_exits_nonzero(server):
    children = server.children()
    core = [c for c in children if "resource_tracker" not in " ".join(c.cmdline())]
    assert len(core) == 1, [c.cmdline() for c in children]
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)

    async def stream_until_error() -> str:
        model = (await client.models.list()).data[0].id
        stream = await client.completions.create(model=model, prompt="Count to a thousand:", max_tokens=200,
                                                 stream=True, extra_body={"ignore_eos": True})
        got = 0
        try:
            async for _chunk in stream:
                got += 1
                if got == 3:
                    core[0].kill()  # SIGKILL: no goodbye message from the core
        except openai.APIError as e:
            return f"error after {got} chunks: {e}"
        return f"finished after {got} chunks"

    async def main() -> str:
        try:
            return await asyncio.wait_for(stream_until_error(), timeout=30)  # an error, not a hang
        finally:
            await client.close()

    outcome = asyncio.run(main())
    assert outcome.startswith("error"), outcome
    t_kill = time.monotonic()
    # /health turns 503 at once (it was noticed within a second), with the OpenAI error shape
    r = httpx.get(server.url + "/health", timeout=5)
    assert r.status_code == 503 and "engine" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi"}, headers=_auth(), timeout=5)
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable_error"
    # then the server exits non-zero (a supervisor restarts it) and leaves nothing behind
    server.proc.wait(timeout=30)
    assert server.proc.returncode not in (0, None)
    assert time.monotonic() - t_kill < 30
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_core_death_before_any_request_is_noticed():
    """A core that dies while the server is idle, before its first request, is noticed too (the process sentinel
    is watched from the start, not from the first request): /health 503, then the server exits non-zero."""
    with ServerProcess(["--max-model-len", "128", "--kv-cache-memory-bytes", str(16 << 20),
                        "--uvicorn-log-level", "warning"]) as srv:
        core = [c for c in srv.children() if "resource_tracker" not in " ".join(c.cmdline())]
        assert len(core) == 1, [c.cmdline() for c in srv.children()]
        core[0].kill()

        def healthy() -> bool:
            try:
                return httpx.get(srv.url + "/health", timeout=10).status_code == 200
            except httpx.TransportError:  # already exited (503 lasts 2 s): not healthy either
                return False

        deadline = time.monotonic() + 30  # noticed within a second; the bound is for a loaded machine
        while healthy():
            assert time.monotonic() < deadline, "/health still 200 30 s after the engine core died"
            time.sleep(0.1)
        srv.proc.wait(timeout=30)
        assert srv.proc.returncode not in (0, None)
