"""The rule of issue 16 for the server's request bodies: every field of the chat and completions schemas is
honored or refused with a 400 naming it (``error.param``); undeclared vLLM fields that would change the
output are refused, others are accepted with a one-time warning in the log.

One real ``octavo serve`` on loopback (embedded SmolLM2), driven with httpx; each check compares two
requests that differ only in the field. The offline half (SamplingParams, prompts, settings) is
test_fields_honored.py; the table is docs/compatibility.md.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
REPEAT = "one two one two one two one two one two one two"


# ------------------------------------------------------------------------------------ server request schemas
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from octavo.server.launch import ServerProcess

    log = tmp_path_factory.mktemp("srv") / "server.log"
    srv = ServerProcess(["--max-model-len", "256", "--kv-cache-memory-bytes", str(32 << 20),
                         "--uvicorn-log-level", "warning", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
                        log_path=str(log)).start()
    srv.log_file = log
    yield srv
    srv.stop()


def post(server, path, body, status=200):
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == status, r.text
    return r


def cmpl(server, **kw):
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True, **kw}
    return post(server, "/v1/completions", body).json()


def toks(server, **kw):
    return cmpl(server, **kw)["choices"][0]["token_ids"]


def chat(server, status=200, **kw):
    body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 6, "temperature": 0, **kw}
    return post(server, "/v1/chat/completions", body, status)


def bad(server, field, path="/v1/completions", **kw):
    body = {"prompt": PROMPT, "max_tokens": 4, **kw} if path == "/v1/completions" else \
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}
    err = post(server, path, body, 400).json()["error"]
    assert err["param"] == field or field in err["message"], err


def sse(server, path, body):
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def differs(field, value, **base):
    def check(server):
        assert toks(server, **base) != toks(server, **base, **{field: value})
    return check


def to_greedy(field, value):
    def check(server):
        greedy = toks(server)
        assert toks(server, temperature=3.0, seed=3) != greedy
        assert toks(server, temperature=3.0, seed=3, **{field: value}) == greedy
    return check


def _s_model(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "model": "no-such-model"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def _s_n(server):
    assert len(cmpl(server, n=2, temperature=1.0, seed=1)["choices"]) == 2


def _s_best_of(server):
    bad(server, "best_of", n=1, best_of=3)


def _s_seed(server):
    assert toks(server, temperature=1.0, seed=7) == toks(server, temperature=1.0, seed=7) != \
        toks(server, temperature=1.0, seed=8)


def _s_stop(server):
    word = cmpl(server)["choices"][0]["text"].split()[1]
    c = cmpl(server, stop=[word])["choices"][0]
    assert word not in c["text"] and c["stop_reason"] == word


def _s_include_stop(server):
    word = cmpl(server)["choices"][0]["text"].split()[1]
    assert cmpl(server, stop=[word], include_stop_str_in_output=True)["choices"][0]["text"].endswith(word)


def _s_stream(server):
    chunks = sse(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True})
    assert len(chunks) >= 4


def _s_stream_options(server):
    body = {"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True}
    plain = sse(server, "/v1/completions", body)
    assert not any("usage" in c for c in plain)
    last = sse(server, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert last[-1]["usage"]["completion_tokens"] == 4 and not any("usage" in c for c in last[:-1])
    every = sse(server, "/v1/completions", {**body, "stream_options": {"include_usage": True,
                                                                      "continuous_usage_stats": True}})
    assert all("usage" in c for c in every) and every[0]["usage"]["completion_tokens"] >= 1
    chat_every = sse(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": 3, "stream_options": {
                                                         "include_usage": True, "continuous_usage_stats": True}})
    assert all("usage" in c for c in chat_every[1:])
    bad(server, "stream_options", stream_options={"include_usage": True})  # not streaming: refused, as vLLM
    bad(server, "stream_options.continuous_usage_stats", stream=True,
        stream_options={"continuous_usage_stats": True})


def _s_user(server):
    cmpl(server, user="someone")
    assert "'user' is not used by octavo" in server.log_file.read_text()


def _s_min_tokens(server):
    first = toks(server)[0]
    assert len(toks(server, ignore_eos=False, stop_token_ids=[first])) == 1
    assert len(toks(server, ignore_eos=False, stop_token_ids=[first], min_tokens=3)) >= 3


def _s_ignore_eos(server):
    eos = 2
    assert len(toks(server, ignore_eos=False, logit_bias={str(eos): 100})) == 1
    assert len(toks(server, logit_bias={str(eos): 100})) == 8


def _s_skip_special(server):
    kw = dict(logit_bias={"1": 100}, max_tokens=2)
    assert "<|im_start|>" in cmpl(server, skip_special_tokens=False, **kw)["choices"][0]["text"]
    assert "<|im_start|>" not in cmpl(server, **kw)["choices"][0]["text"]


def _s_stop_token_ids(server):
    greedy = toks(server)
    assert toks(server, ignore_eos=False, stop_token_ids=[greedy[1]]) == greedy[:2]


def _s_prompt_logprobs(server):
    assert "prompt_logprobs" not in cmpl(server)["choices"][0]
    plp = cmpl(server, prompt_logprobs=1)["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and all(isinstance(p, dict) and p for p in plp[1:])
    assert chat(server, prompt_logprobs=0).json()["prompt_logprobs"][1]
    bad(server, "prompt_logprobs", prompt_logprobs=1, stream=True)


def _s_return_token_ids(server):
    assert "token_ids" not in cmpl(server, return_token_ids=False)["choices"][0]
    assert len(toks(server)) == 8


def _s_priority(server):
    bad(server, "priority", priority=1)


def _s_request_id(server):
    assert cmpl(server, request_id="my-id-1")["id"] == "my-id-1"


def _s_truncate(server):
    c = cmpl(server, prompt=list(range(100, 140)), truncate_prompt_tokens=8)
    assert c["choices"][0]["prompt_token_ids"] == list(range(132, 140)) and c["usage"]["prompt_tokens"] == 8


def _s_cache_salt(server):
    prompt = list(range(300, 340))

    def cached(**kw):
        before = _hits(server)
        cmpl(server, prompt=prompt, max_tokens=1, **kw)
        return _hits(server) - before
    cached(cache_salt="a")
    assert cached(cache_salt="a") >= 32 and cached(cache_salt="b") == 0
    bad(server, "cache_salt", cache_salt="")


def _hits(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    m = re.search(r"^octavo:prefix_cache_hits(?:_total)?(?:\{[^}]*\})? (\S+)$", text, re.M)
    assert m, "prefix-cache hit counter missing from /metrics"
    return float(m.group(1))


def _s_prompt(server):
    assert cmpl(server)["choices"][0]["prompt_token_ids"] != cmpl(server, prompt="Hello")["choices"][0][
        "prompt_token_ids"]


def _s_max_tokens(server):
    assert len(toks(server, max_tokens=3)) == 3
    assert chat(server, max_tokens=2, ignore_eos=True).json()["usage"]["completion_tokens"] == 2


def _s_max_completion_tokens(server):
    assert chat(server, max_completion_tokens=3, ignore_eos=True).json()["usage"]["completion_tokens"] == 3


def _s_logprobs(server):
    assert cmpl(server)["choices"][0]["logprobs"] is None
    assert len(cmpl(server, logprobs=2)["choices"][0]["logprobs"]["top_logprobs"][0]) >= 2
    assert chat(server, logprobs=True).json()["choices"][0]["logprobs"]["content"]


def _s_top_logprobs(server):
    content = chat(server, logprobs=True, top_logprobs=3).json()["choices"][0]["logprobs"]["content"]
    assert len(content[0]["top_logprobs"]) == 3


def _s_echo(server):
    assert cmpl(server, echo=True)["choices"][0]["text"].startswith(PROMPT)
    bad(server, "echo", "/v1/chat/completions", echo=True)


def _s_suffix(server):
    bad(server, "suffix", suffix="x")


def _s_add_special_tokens(server):
    # SmolLM2's tokenizer adds no special tokens, so the field is checked for acceptance only (the value
    # reaches the tokenizer in OpenAIServing.encode); a tokenizer with a BOS would differ here.
    assert cmpl(server, add_special_tokens=False)["choices"][0]["prompt_token_ids"]


def _s_messages(server):
    a = chat(server).json()["usage"]["prompt_tokens"]
    b = chat(server, messages=[{"role": "user", "content": "Say hi, please, now"}]).json()["usage"]["prompt_tokens"]
    assert a != b
    bad(server, "messages", "/v1/chat/completions",
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def _s_response_format(server):
    r = chat(server, max_tokens=20, response_format={"type": "json_object"}).json()
    assert r["choices"][0]["message"]["content"].lstrip().startswith(("{", "["))


def _s_tools(server):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    assert not chat(server, max_tokens=40, tools=[tool], tool_choice="none").json()["choices"][0]["message"].get(
        "tool_calls")
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = chat(server, messages=msgs, max_tokens=60, tools=[tool], tool_choice="required").json()["choices"][0]
    assert r["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def _s_add_generation_prompt(server):
    a = chat(server).json()["usage"]["prompt_tokens"]
    assert chat(server, add_generation_prompt=False).json()["usage"]["prompt_tokens"] < a


def _s_continue_final_message(server):
    msgs = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hello there"}]
    a = chat(server, messages=msgs, add_generation_prompt=False).json()["usage"]["prompt_tokens"]
    b = chat(server, messages=msgs, add_generation_prompt=False, continue_final_message=True).json()
    assert b["usage"]["prompt_tokens"] < a  # the final turn is left open (no end-of-turn tokens)


def _s_chat_template(server):
    bad(server, "chat_template", "/v1/chat/completions", chat_template="{{ messages[0].content }}")


def _s_chat_template_kwargs(server):
    bad(server, "chat_template_kwargs", "/v1/chat/completions", chat_template_kwargs={"messages": []})
    a = chat(server).json()["usage"]["prompt_tokens"]
    assert chat(server, chat_template_kwargs={"add_generation_prompt_extra": 1}).json()["usage"]["prompt_tokens"] == a


SERVER_CHECKS = {
    "model": _s_model, "n": _s_n, "best_of": _s_best_of, "temperature": differs("temperature", 5.0, seed=3),
    "top_p": to_greedy("top_p", 1e-4), "top_k": to_greedy("top_k", 1), "min_p": to_greedy("min_p", 1.0),
    "presence_penalty": differs("presence_penalty", 2.0, prompt=REPEAT, max_tokens=12),
    "frequency_penalty": differs("frequency_penalty", 2.0, prompt=REPEAT, max_tokens=12),
    "repetition_penalty": differs("repetition_penalty", 3.0, prompt=REPEAT, max_tokens=12),
    "logit_bias": differs("logit_bias", {"42": 100}), "seed": _s_seed, "stop": _s_stop, "stream": _s_stream,
    "stream_options": _s_stream_options, "user": _s_user, "min_tokens": _s_min_tokens, "ignore_eos": _s_ignore_eos,
    "skip_special_tokens": _s_skip_special,
    "spaces_between_special_tokens": lambda s: bad(s, "spaces_between_special_tokens", skip_special_tokens=False,
                                                   spaces_between_special_tokens=False),
    "include_stop_str_in_output": _s_include_stop, "stop_token_ids": _s_stop_token_ids,
    "allowed_token_ids": differs("allowed_token_ids", [42]), "prompt_logprobs": _s_prompt_logprobs,
    "return_token_ids": _s_return_token_ids, "priority": _s_priority, "request_id": _s_request_id,
    "truncate_prompt_tokens": _s_truncate, "cache_salt": _s_cache_salt, "prompt": _s_prompt,
    "max_tokens": _s_max_tokens, "max_completion_tokens": _s_max_completion_tokens, "logprobs": _s_logprobs,
    "top_logprobs": _s_top_logprobs, "echo": _s_echo, "suffix": _s_suffix, "add_special_tokens": _s_add_special_tokens,
    "messages": _s_messages, "response_format": _s_response_format, "tools": _s_tools, "tool_choice": _s_tools,
    "add_generation_prompt": _s_add_generation_prompt, "continue_final_message": _s_continue_final_message,
    "chat_template": _s_chat_template, "chat_template_kwargs": _s_chat_template_kwargs,
}


def test_every_server_field_has_a_check():
    from octavo.server.protocol import ChatCompletionRequest, CompletionRequest

    fields = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
    assert fields == set(SERVER_CHECKS), (fields ^ set(SERVER_CHECKS))


@pytest.mark.parametrize("field", sorted(SERVER_CHECKS))
def test_server_field(server, field):
    SERVER_CHECKS[field](server)


@pytest.mark.parametrize("field", ["bad_words", "logits_processors", "prompt_embeds",
                                   "length_penalty", "functions"])
def test_server_refuses_vllm_fields_it_does_not_implement(server, field):
    from octavo.server.vllm_fields import REFUSED

    value = {"bad_words": ["Paris"], "length_penalty": 2.0}.get(field, ["x"])
    bad(server, field, **{field: value})
    noop = REFUSED[field][0][0]
    assert httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1, field: noop},
                      timeout=30).status_code == 200


def test_server_unknown_field_warns_once(server):
    for _ in range(2):
        cmpl(server, max_tokens=1, store=True, some_vendor_field=1)
    log = server.log_file.read_text()
    assert log.count("'some_vendor_field' is not used by octavo") == 1


def test_tokenize_detokenize_fields(server):
    a = post(server, "/tokenize", {"prompt": PROMPT}).json()
    assert "token_strs" not in a and post(server, "/tokenize", {"prompt": PROMPT, "return_token_strs": True}
                                          ).json()["token_strs"]
    m = post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()["count"]
    assert post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}],
                                      "add_generation_prompt": False}).json()["count"] < m
    assert post(server, "/detokenize", {"tokens": a["tokens"]}).json()["prompt"] == PROMPT
