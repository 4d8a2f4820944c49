"""The hostile-input corpus: requests an attacker (or a buggy client) sends, and what each must get back.

Each case: (name, method, path, body, expected status, expected ``param``). ``body`` is a dict (sent as
JSON, NaN/inf allowed on the wire), raw ``bytes``, or None. ``param`` ``...`` means "don't check"; a
string means the error must name exactly that field. Every case from issue 15 is here (integers above
2^64, render errors, reserved template kwargs, surrogates, deep nesting, NaN/inf, internal field names).
"""

from __future__ import annotations

M = [{"role": "user", "content": "Hi"}]
BIG = 2**70
GEN = ("/v1/completions", "/v1/chat/completions")


def _nested(depth: int) -> dict:
    node: dict = {"a": "x"}
    for _ in range(depth):
        node = {"a": node}
    return node


def _chat(**kw) -> dict:
    return {"messages": M, "max_tokens": 2, **kw}


def _cmpl(**kw) -> dict:
    return {"prompt": "Hi", "max_tokens": 2, **kw}


CASES: list[tuple[str, str, str, object, int, object]] = [
    # integers beyond every bound (msgpack overflowed on these)
    *[(f"huge-{f}-{p.split('/')[-1]}", "POST", p, {**(_chat() if "chat" in p else _cmpl()), f: BIG}, 400, f)
      for p in GEN for f in ("max_tokens", "seed", "top_k", "priority", "min_tokens", "n", "best_of",
                             "prompt_logprobs")],
    ("huge-max_completion_tokens", "POST", "/v1/chat/completions", _chat(max_completion_tokens=BIG), 400,
     "max_completion_tokens"),
    ("neg-huge-seed", "POST", "/v1/completions", _cmpl(seed=-BIG), 400, "seed"),
    ("huge-stop_token_ids", "POST", "/v1/completions", _cmpl(stop_token_ids=[BIG]), 400, ...),
    ("huge-token-prompt", "POST", "/v1/completions", {"prompt": [1, BIG], "max_tokens": 1}, 400, ...),
    ("huge-logit_bias-key", "POST", "/v1/completions", _cmpl(logit_bias={str(BIG): 1.0}), 400, "logit_bias"),
    ("huge-top_logprobs", "POST", "/v1/chat/completions", _chat(logprobs=True, top_logprobs=BIG), 400,
     "top_logprobs"),
    ("huge-logprobs", "POST", "/v1/completions", _cmpl(logprobs=BIG), 400, "logprobs"),
    ("huge-detokenize", "POST", "/detokenize", {"tokens": [BIG]}, 400, ...),
    ("huge-embeddings-priority", "POST", "/v1/embeddings", {"input": "x", "priority": BIG}, 400, ...),
    # semantic limits name the client's field
    ("zero-max_completion_tokens", "POST", "/v1/chat/completions", _chat(max_completion_tokens=0), 400,
     "max_completion_tokens"),
    ("zero-max_tokens", "POST", "/v1/completions", _cmpl(max_tokens=0), 400, "max_tokens"),
    ("logprobs-over-max", "POST", "/v1/completions", _cmpl(logprobs=1000), 400, "logprobs"),
    ("token-outside-vocab", "POST", "/v1/completions", {"prompt": [10**9], "max_tokens": 1}, 400, "prompt"),
    ("prompt-too-long", "POST", "/v1/completions", {"prompt": [1] * 600, "max_tokens": 1}, 400, "prompt"),
    ("empty-prompt-list", "POST", "/v1/completions", {"prompt": [], "max_tokens": 1}, 400, ...),
    ("temperature-negative", "POST", "/v1/completions", _cmpl(temperature=-1), 400, "temperature"),
    # NaN / inf (Python's JSON accepts these literals)
    *[(f"nan-{f}", "POST", "/v1/chat/completions", _chat(**{f: v}), 400, f)
      for f, v in (("temperature", float("nan")), ("temperature", float("inf")), ("top_p", float("nan")),
                   ("repetition_penalty", float("inf")), ("presence_penalty", float("-inf")),
                   ("frequency_penalty", float("nan")), ("min_p", float("nan")))],
    ("nan-logit_bias", "POST", "/v1/completions", _cmpl(logit_bias={"1": float("nan")}), 400, ...),
    # chat-template render errors are 400s (or render fine), never 500s
    ("message-without-content", "POST", "/v1/chat/completions", _chat(messages=[{"role": "user"}]), 200, None),
    ("content-null", "POST", "/v1/chat/completions", _chat(messages=[{"role": "user", "content": None}]), 200,
     None),
    ("assistant-null-with-tool_calls", "POST", "/v1/chat/completions",
     _chat(messages=[*M, {"role": "assistant", "content": None, "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "c1", "content": "42"}]), (200, 400), ...),
    ("request-template-refused", "POST", "/v1/chat/completions", _chat(chat_template="{{ 'x' }}"), 400,
     "chat_template"),
    ("request-template-include", "POST", "/v1/chat/completions", _chat(chat_template="{% include 'x' %}"), 400,
     "chat_template"),
    ("request-template-syntax", "POST", "/v1/chat/completions", _chat(chat_template="{% for %}"), 400,
     "chat_template"),
    ("template-kwargs-tokenize", "POST", "/v1/chat/completions", _chat(chat_template_kwargs={"tokenize": True}),
     400, "chat_template_kwargs"),
    ("template-kwargs-messages", "POST", "/v1/chat/completions", _chat(chat_template_kwargs={"messages": []}),
     400, "chat_template_kwargs"),
    ("bad-role", "POST", "/v1/chat/completions", _chat(messages=[{"role": 7, "content": "x"}]), 400, ...),
    ("image-part", "POST", "/v1/chat/completions",
     _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400, ...),
    ("content-int", "POST", "/v1/chat/completions", _chat(messages=[{"role": "user", "content": 5}]), 400, ...),
    ("messages-empty", "POST", "/v1/chat/completions", _chat(messages=[]), 400, "messages"),
    ("messages-not-list", "POST", "/v1/chat/completions", _chat(messages="hi"), 400, "messages"),
    # text the engine cannot carry
    ("surrogate-content", "POST", "/v1/chat/completions",
     _chat(messages=[{"role": "user", "content": "a\ud800b"}]), 400, "messages[0].content"),
    ("surrogate-prompt", "POST", "/v1/completions", _cmpl(prompt="\udfff"), 400, "prompt"),
    ("surrogate-stop", "POST", "/v1/completions", _cmpl(stop=["\ud83d"]), 400, "stop[0]"),
    ("nul-prompt", "POST", "/v1/completions", _cmpl(prompt="a\x00b"), 400, "prompt"),
    ("nul-tokenize", "POST", "/tokenize", {"prompt": "\x00"}, 400, "prompt"),
    ("surrogate-key", "POST", "/v1/completions", {**_cmpl(), "\ud800": 1}, 400, ...),
    # nesting
    ("nested-300", "POST", "/v1/chat/completions",
     _chat(messages=[{"role": "user", "content": "x", "extra": _nested(300)}]), 400, ...),
    ("nested-array-5000", "POST", "/v1/completions", b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, ...),
    # malformed bodies
    ("not-json", "POST", "/v1/completions", b"{not json", 400, ...),
    ("json-array-body", "POST", "/v1/completions", b"[1, 2]", 400, ...),
    ("empty-body", "POST", "/v1/chat/completions", b"", 400, ...),
    ("invalid-utf8", "POST", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, ...),
    ("missing-prompt", "POST", "/v1/completions", {"max_tokens": 1}, 400, "prompt"),
    ("wrong-type-stream", "POST", "/v1/completions", _cmpl(stream="maybe"), 400, "stream"),
    ("unknown-model", "POST", "/v1/completions", _cmpl(model="gpt-9"), 404, "model"),
    ("bad-request-id", "POST", "/v1/completions", _cmpl(request_id="x" * 1000), 400, "request_id"),
    ("tokenize-both", "POST", "/tokenize", {"prompt": "x", "messages": M}, 400, "prompt"),
    ("detokenize-negative", "POST", "/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("embeddings-on-generative", "POST", "/v1/embeddings", {"input": "x"}, 400, ...),
    ("wrong-method", "GET", "/v1/completions", None, 405, ...),
    ("no-route", "GET", "/v1/nothing", None, 404, ...),
    ("suffix-unsupported", "POST", "/v1/completions", _cmpl(suffix="x"), 400, ...),
    ("bad-response_format", "POST", "/v1/chat/completions", _chat(response_format={"type": "bogus"}), 400, ...),
]
