"""End to end: a real ``octavo serve`` on loopback (embedded SmolLM2), driven by the official ``openai`` client.

One server per module (one model load), plus an in-process offline ``LLM`` on the same weights as the
reference for greedy outputs. Short outputs keep the module fast.
"""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai
import psutil
import pytest

from octavo.server.launch import ServerProcess

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 512
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
SERVER_ARGS = ["--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory-bytes", str(128 << 20),
               "--uvicorn-log-level", "warning"]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(SERVER_ARGS).start()
    children = srv.children()
    assert children, "the engine core should run in its own process"
    yield srv
    rc = srv.stop()
    assert rc == 0, f"octavo serve exited with {rc} after SIGTERM"
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE], \
        "a child process outlived the server"


@pytest.fixture(scope="module")
def offline():
    from octavo import LLM

    return LLM(max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=64 << 20)


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


# ------------------------------------------------------------------------------------------ basics
def test_models_health_version(server, client, model):
    assert model == "SmolLM2-135M-Instruct"
    assert client.models.list().data[0].max_model_len == MAX_MODEL_LEN
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/version").json()["version"]


def test_tokenize_detokenize(server, offline):
    tok = offline.get_tokenizer()
    r = httpx.post(server.url + "/tokenize", json={"prompt": PROMPTS[0]}).json()
    assert r["tokens"] == tok(PROMPTS[0]).input_ids and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == MAX_MODEL_LEN
    assert httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == PROMPTS[0]
    chat = httpx.post(server.url + "/tokenize", json={"messages": CHAT}).json()
    assert chat["count"] > r["count"]


# ------------------------------------------------------------------------------------------ correctness
def test_completions_greedy_equal_offline_llm(client, model, offline):
    from octavo import SamplingParams

    ref = offline.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    resp = client.completions.create(model=model, prompt=PROMPTS, temperature=0, max_tokens=12)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    tok = offline.get_tokenizer()
    for choice, r in zip(resp.choices, ref):
        assert choice.text == r.outputs[0].text
        assert choice.finish_reason == r.outputs[0].finish_reason
    assert resp.usage.prompt_tokens == sum(len(tok(p).input_ids) for p in PROMPTS)
    assert resp.usage.completion_tokens == sum(len(r.outputs[0].token_ids) for r in ref)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_chat_greedy_equal_offline_llm(client, model, offline):
    from octavo import SamplingParams

    ref = offline.chat(CHAT, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
    resp = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=16)
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == ref.outputs[0].text
    assert resp.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert resp.usage.completion_tokens == len(ref.outputs[0].token_ids)


def test_token_array_prompts(client, model, offline):
    ids = [offline.get_tokenizer()(p).input_ids for p in PROMPTS[:2]]
    by_ids = client.completions.create(model=model, prompt=ids, temperature=0, max_tokens=6)
    by_text = client.completions.create(model=model, prompt=PROMPTS[:2], temperature=0, max_tokens=6)
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
    single = client.completions.create(model=model, prompt=ids[0], temperature=0, max_tokens=6)
    assert single.choices[0].text == by_text.choices[0].text


def test_streamed_text_equals_non_streamed(client, model):
    full = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=16)
    chunks = list(client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=16,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens

    full = client.completions.create(model=model, prompt=PROMPTS[2], temperature=0, max_tokens=12)
    chunks = list(client.completions.create(model=model, prompt=PROMPTS[2], temperature=0, max_tokens=12,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_n_seed_stream_and_not(client, model):
    kw = dict(model=model, messages=CHAT, temperature=1.0, max_tokens=10, n=3, seed=1234)
    full = client.chat.completions.create(**kw)
    assert sorted(c.index for c in full.choices) == [0, 1, 2]
    texts = {i: "" for i in range(3)}
    finished = set()
    for chunk in client.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finished.add(ch.index)
    assert finished == {0, 1, 2}
    # the same seed gives the same samples, streamed or not, whatever else shares the batch
    assert [texts[i] for i in range(3)] == [c.message.content for c in sorted(full.choices, key=lambda c: c.index)]
    assert len({c.message.content for c in full.choices}) > 1, "n sequences of one seed should differ"
    again = client.chat.completions.create(**kw)
    assert [c.message.content for c in again.choices] == [c.message.content for c in full.choices]


def test_chat_logprobs(client, model):
    resp = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=8, logprobs=True,
                                          top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    # the tokens spell the text (plus the EOS token, which counts as generated but is not shown as text)
    assert "".join(t.token for t in content).startswith(resp.choices[0].message.content)
    for t in content:
        assert len(t.top_logprobs) == 3
        assert t.token == t.top_logprobs[0].token and t.logprob == pytest.approx(t.top_logprobs[0].logprob)
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
        assert t.logprob <= 0


def test_completion_logprobs_and_echo(client, model, offline):
    n_prompt = len(offline.get_tokenizer()(PROMPTS[0]).input_ids)
    resp = client.completions.create(model=model, prompt=PROMPTS[0], temperature=0, max_tokens=5, logprobs=2,
                                     echo=True)
    choice = resp.choices[0]
    assert choice.text.startswith(PROMPTS[0])
    lp = choice.logprobs
    assert len(lp.tokens) == n_prompt + 5 == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.token_logprobs[0] is None and all(x is not None for x in lp.token_logprobs[1:])
    assert all(len(t) >= 2 for t in lp.top_logprobs[1:])
    no_echo = client.completions.create(model=model, prompt=PROMPTS[0], temperature=0, max_tokens=5, logprobs=2)
    assert no_echo.choices[0].logprobs.token_logprobs == pytest.approx(lp.token_logprobs[n_prompt:])
    assert choice.text == PROMPTS[0] + no_echo.choices[0].text


def test_stop_and_vllm_extras(client, model):
    base = client.completions.create(model=model, prompt=PROMPTS[1], temperature=0, max_tokens=24)
    text = base.choices[0].text
    assert base.choices[0].finish_reason == "length"
    stop = text.strip()[:3]
    cut = client.completions.create(model=model, prompt=PROMPTS[1], temperature=0, max_tokens=24, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and stop not in cut.choices[0].text
    assert text.startswith(cut.choices[0].text)
    r = client.completions.create(model=model, prompt=PROMPTS[1], temperature=0, max_tokens=6, extra_body={
        "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 6, "ignore_eos": True,
        "return_token_ids": True, "skip_special_tokens": True})
    assert r.usage.completion_tokens == 6 and len(r.choices[0].model_extra["token_ids"]) == 6
    mc = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_completion_tokens=3,
                                        user="tester")
    assert mc.usage.completion_tokens == 3 and mc.choices[0].finish_reason == "length"


# ------------------------------------------------------------------------------------------ errors
BAD = [
    ("/v1/chat/completions", "{not json", 400),
    ("/v1/chat/completions", {"model": None, "messages": []}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 0}, 400),
    ("/v1/chat/completions", {"messages": [{"role": 7, "content": "hi"}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                              "top_logprobs": 50}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4"}, 404),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                              "max_tokens": -5}, 400),
    ("/v1/completions", {"prompt": "x " * (MAX_MODEL_LEN + 10)}, 400),
    ("/v1/completions", {"prompt": [1, 2, 10**9]}, 400),
    ("/v1/completions", {"prompt": "hi", "logprobs": 100}, 400),
    ("/v1/completions", {"prompt": []}, 400),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [-3]}, 400),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"abc": 1}}, 400),
    ("/v1/completions", {"prompt": "hi", "min_tokens": 10, "max_tokens": 2}, 400),
    ("/v1/completions", {"prompt": "hi", "suffix": "tail"}, 400),
    ("/v1/completions", {"prompt": "hi", "stream": True, "logprobs": 99}, 400),
    ("/v1/nope", {}, 404),
    ("/detokenize", {"tokens": [10**9]}, 400),
    ("/tokenize", {}, 400),
]


@pytest.mark.parametrize("path,body,status", BAD, ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)])
def test_errors_have_openai_shape(server, model, path, body, status):
    if isinstance(body, dict) and "model" not in body:
        body = {**body, "model": model}
    if isinstance(body, dict) and body.get("model") is None:
        body.pop("model")
    kw = {"content": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, str) \
        else {"json": body}
    r = httpx.post(server.url + path, timeout=30, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]


def test_still_serving_after_errors(client, model):
    r = client.completions.create(model=model, prompt=PROMPTS[0], temperature=0, max_tokens=4)
    assert r.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt=PROMPTS[0], temperature=-2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt=PROMPTS[0])


# ------------------------------------------------------------------------------------------ load and aborts
def test_64_concurrent_streams(server, client, model):
    prompts = [f"Count from {i} to {i + 5}:" for i in range(8)]
    expected = {p: client.completions.create(model=model, prompt=p, temperature=0, max_tokens=8).choices[0].text
                for p in prompts}

    async def one(aclient: openai.AsyncOpenAI, prompt: str) -> tuple[str, str, int]:
        text, finish, usage = "", None, None
        stream = await aclient.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=8,
                                                  stream=True, stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage.completion_tokens
        return text, finish, usage

    async def main() -> list:
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
        try:
            return await asyncio.gather(*(one(aclient, prompts[i % 8]) for i in range(64)))
        finally:
            await aclient.close()

    results = asyncio.run(main())
    assert len(results) == 64
    for i, (text, finish, usage) in enumerate(results):
        assert finish == "length" and usage == 8
        assert text == expected[prompts[i % 8]]
    assert _metric(server.url, "octavo:num_requests_running") == 0


def test_disconnect_frees_kv_blocks(server, model):
    body = {"model": model, "prompt": PROMPTS[2], "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data:"):
                got += 1
            if got >= 3:
                break
        assert _metric(server.url, "octavo:kv_cache_usage_perc") > 0
        assert _metric(server.url, "octavo:num_requests_running") == 1
    # the connection is closed: the request is aborted and its blocks come back
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _metric(server.url, "octavo:kv_cache_usage_perc") > 0:
        time.sleep(0.05)
    assert _metric(server.url, "octavo:kv_cache_usage_perc") == 0
    assert _metric(server.url, "octavo:num_requests_running") == 0
    # a non-streaming client that gives up is aborted too
    body = {"model": model, "prompt": PROMPTS[1], "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=1.0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _metric(server.url, "octavo:kv_cache_usage_perc") > 0:
        time.sleep(0.05)
    assert _metric(server.url, "octavo:kv_cache_usage_perc") == 0


def test_metrics(server):
    text = httpx.get(server.url + "/metrics").text
    for name in ["octavo:num_requests_running", "octavo:num_requests_waiting", "octavo:kv_cache_usage_perc",
                 "octavo:prefix_cache_hit_rate", "octavo:prefix_cache_queries_total", "octavo:num_preemptions_total",
                 "octavo:prompt_tokens_total", "octavo:generation_tokens_total",
                 "octavo:time_to_first_token_seconds_bucket", "octavo:time_per_output_token_seconds_bucket",
                 "octavo:e2e_request_latency_seconds_bucket", "octavo:request_success_total"]:
        assert name in text, name
    assert _metric(server.url, "octavo:generation_tokens_total") > 64 * 8
    assert _metric(server.url, "octavo:e2e_request_latency_seconds_count") > 64
    assert _metric(server.url, "octavo:prefix_cache_hit_rate") > 0  # the repeated prompts hit the prefix cache
