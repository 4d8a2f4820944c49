"""vLLM's server surface on one real ``octavo serve`` over TLS (issue 16): ``/v1/responses`` with the official
``openai`` client (create, stream events, retrieve, previous_response_id), several ``--served-model-name``,
``--ssl-keyfile/--ssl-certfile`` (a self-signed certificate made here with openssl), request-id headers, the
request / access / throughput log lines, and the dev-mode routes (sleep, wake_up, collective_rpc).
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time

import httpx
import openai
import pytest

from octavo.server.launch import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make the test certificate")
    d = tmp_path_factory.mktemp("tls")
    key, cert = d / "key.pem", d / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    log = d / "server.log"
    srv = ServerProcess(["--max-model-len", "512", "--kv-cache-memory-bytes", str(32 << 20), "--uvicorn-log-level",
                         "warning", "--ssl-keyfile", str(key), "--ssl-certfile", str(cert), "--served-model-name",
                         "smol", "alias", "--enable-request-id-headers", "--enable-log-requests", "--max-log-len",
                         "48", "--enable-sleep-mode"],
                        env={"OCTAVO_SERVER_DEV_MODE": "1", "OCTAVO_LOG_STATS_INTERVAL": "1"}, log_path=str(log))
    srv.verify = ssl.create_default_context(cafile=str(cert))
    srv.log_file = log
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, verify=server.verify, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         http_client=httpx.Client(verify=server.verify, timeout=120))


def test_tls_and_several_served_names(server, http, client):
    assert server.url.startswith("https://")
    with pytest.raises(httpx.HTTPError):  # plain HTTP is not spoken on a TLS port
        httpx.get(server.url.replace("https", "http") + "/health", timeout=5)
    assert [m.id for m in client.models.list().data] == ["smol", "alias"]
    c = client.chat.completions.create(model="alias", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert c.model == "smol" and c.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)


def test_custom_message_role(client):
    """A role beyond system/user/assistant/tool goes to the chat template (vLLM); SmolLM2's renders any role."""
    c = client.chat.completions.create(model="smol", messages=[{"role": "narrator", "content": "Once upon a time"},
                                                               {"role": "user", "content": "Go on."}], max_tokens=3)
    assert c.choices[0].message.content


def test_request_id_headers_on_every_route(http):
    assert http.get("/v1/models").headers.get("x-request-id")
    assert http.get("/version", headers={"X-Request-Id": "abc-1"}).headers["x-request-id"] == "abc-1"


def test_responses_create_equals_chat(client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]
    chat = client.chat.completions.create(model="smol", messages=msgs, max_tokens=12, temperature=0)
    r = client.responses.create(model="smol", instructions="Be brief.", input="Name a color.", max_output_tokens=12,
                                temperature=0)
    assert r.object == "response" and r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    follow = client.responses.create(model="smol", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "And another?"}]}], previous_response_id=r.id, max_output_tokens=8,
        temperature=0)
    ref = client.chat.completions.create(model="smol", messages=[
        {"role": "user", "content": "Name a color."}, {"role": "assistant", "content": r.output_text},
        {"role": "user", "content": "And another?"}], max_tokens=8, temperature=0)
    assert follow.output_text == ref.choices[0].message.content


def test_responses_stream_events(client):
    with client.responses.stream(model="smol", input="Count: one, two,", max_output_tokens=6,
                                 temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]  # its response's status may be "incomplete" (max_output_tokens)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == final.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    plain = client.responses.create(model="smol", input="Count: one, two,", max_output_tokens=6, temperature=0)
    assert plain.output_text == final.output_text


def test_responses_refusals(client):
    for extra, param in (({"tools": [{"type": "web_search"}]}, "tools"), ({"background": True}, "background")):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="smol", input="x", max_output_tokens=2, extra_body=extra)
        assert e.value.body["param"] == param
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_missing")


def test_dev_mode_sleep_and_collective_rpc(http):
    freed = http.post("/sleep", params={"level": 1}).json()["freed"]
    assert freed["kv_cache_bytes"] > 0 and http.get("/is_sleeping").json() == {"is_sleeping": True}
    asleep = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert asleep.status_code >= 400 and "asleep" in asleep.text
    assert http.post("/wake_up").status_code == 200 and http.get("/is_sleeping").json() == {"is_sleeping": False}
    assert http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    info = http.post("/collective_rpc", json={"method": "info"}).json()["results"]
    assert len(info) == 1 and info[0]["num_blocks"] > 0
    bad = http.post("/collective_rpc", json={"method": "_private"})
    assert bad.status_code == 400 and "no public method" in bad.text


def test_log_lines(server, http):
    http.post("/v1/completions", json={"prompt": "A long prompt that the request log must cut short", "max_tokens": 4})
    # the server writes the access line once the response is sent, so the client can read the log first (CI saw
    # it; ~1 % of responses under load): wait for this request's lines, and for a throughput line
    deadline = time.monotonic() + 30
    while True:
        log = server.log_file.read_text(errors="replace")
        ours = [ln for ln in log.splitlines() if "Received request" in ln and "A long prompt" in ln]
        done = ours and "Avg prompt throughput" in log and '"POST /v1/completions HTTP/1.1" 200' in log
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert "Avg prompt throughput" in log and "Avg generation throughput" in log
    assert '"POST /v1/completions HTTP/1.1" 200' in log  # the access line
    assert ours, "no 'Received request' line for the request 30 s after its response"
    line = ours[0]
    assert line.endswith("...") and "must cut short" not in line  # --max-log-len 48


def test_a_streamed_request_is_logged_when_its_stream_starts(server, http):
    # vLLM logs a request on arrival; octavo logs it as its response starts (it then has the request id), so a
    # long stream's request is in the log before the stream's first chunk reaches the client, not after its end
    body = {"prompt": "Stream marker 7f3a", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(ln for ln in lines if ln.startswith("data: "))
        log = server.log_file.read_text(errors="replace")
        chunks = 1 + sum(ln.startswith("data: {") for ln in lines)
    assert '"text"' in first and chunks >= 400  # the stream really was long: 400 tokens after the read above
    assert any("Received request" in ln and "Stream marker 7f3a" in ln for ln in log.splitlines()), \
        "the streamed request was not in the log when its first chunk arrived"
