"""The hostile corpus against every route: no 5xx, no hang, OpenAI-shaped errors naming the client's field,
one log line per 4xx and no traceback, and the keep-alive connection survives every error."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.reliability.corpus import CASES
from tests.reliability.helpers import assert_openai_error, tracebacks


def send(client: httpx.Client, method: str, path: str, body: object) -> httpx.Response:
    if body is None:
        return client.request(method, path)
    data = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
    return client.request(method, path, content=data, headers={"content-type": "application/json"})


@pytest.mark.parametrize("name,method,path,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_hostile_case(server, http, name, method, path, body, status, param):
    resp = send(http, method, path, body)
    allowed = status if isinstance(status, tuple) else (status,)
    assert resp.status_code in allowed, (name, resp.status_code, resp.text[:300])
    assert resp.status_code < 500
    if resp.status_code >= 400:
        err = assert_openai_error(resp)
        if param is not ...:
            assert err["param"] == param, (name, err)
        # the same pooled connection serves the next, innocent request
        assert resp.headers.get("connection", "").lower() != "close"
        assert http.get("/health").status_code == 200


def test_no_traceback_and_one_line_per_4xx(server, http):
    before = server.log_file.read_text(errors="replace").count("answered 400")
    resp = send(http, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 0})
    assert resp.status_code == 400
    after = server.log_file.read_text(errors="replace").count("answered 400")
    assert after - before == 1
    assert tracebacks(server) == 0


def test_keepalive_connection_reused_after_errors(server):
    """Errors never close the pooled connection: every request below goes over the same socket."""
    peers = set()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for _, method, path, body, *_ in CASES[:: max(1, len(CASES) // 12)]:
            with client.stream(method, path, content=None if body is None else (
                    body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()),
                    headers={"content-type": "application/json"}) as resp:
                resp.read()
                sock = resp.extensions["network_stream"].get_extra_info("socket")
                peers.add(sock.getsockname())
    assert len(peers) == 1, peers


def test_oversized_body_is_413_before_parsing(server, http):
    body = b'{"prompt": "' + b"a" * (10 << 20) + b'", "max_tokens": 1}'
    resp = http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert_openai_error(resp)
    assert http.get("/health").status_code == 200


def test_chunked_oversized_body_is_413(server):
    def chunks():
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"a" * (1 << 20)
        yield b'"}'

    with httpx.Client(base_url=server.url, timeout=60) as client:
        resp = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert_openai_error(resp)


def test_long_text_prompt_refused_untokenized(server, http):
    """A 3 MB prompt (under the body limit) is refused by the size bound, not tokenized for seconds."""
    resp = http.post("/v1/completions", json={"prompt": "word " * 600_000, "max_tokens": 1})
    assert resp.status_code == 400
    assert assert_openai_error(resp)["param"] == "prompt"


def test_request_id_echoed_in_body_and_header(server, http):
    resp = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "request_id": "my-id-1"})
    assert resp.status_code == 200
    assert resp.json()["id"] == "my-id-1" and resp.headers["x-request-id"] == "my-id-1"
    resp = http.post("/v1/chat/completions", headers={"X-Request-Id": "hdr-7"},
                     json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    assert resp.json()["id"] == "hdr-7" and resp.headers["x-request-id"] == "hdr-7"
