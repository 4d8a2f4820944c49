"""Property-based fuzzing of the server's own OpenAPI schema (hypothesis; ``schema_strategy``).

Bodies are drawn from each route's request schema (``GET /openapi.json``), with random JSON mixed into
fields and valid chats mixed into ``messages`` so both the validators and the engine get exercised.
Generation lengths are kept to a few tokens (the corpus covers huge values). The property, for every
request: no 5xx, an answer within the timeout (no hang), and every error in OpenAI's shape.
``make reliability`` runs >= 5,000 requests; ``make test`` a few hundred.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.helpers import FULL, assert_openai_error, scale
from tests.reliability.schema_strategy import from_schema

ROUTES = {"/v1/completions": "CompletionRequest", "/v1/chat/completions": "ChatCompletionRequest",
          "/tokenize": "TokenizeRequest", "/detokenize": "DetokenizeRequest"}
TOTAL = scale(240, 5200)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=4), max_leaves=12)
chats = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool", "x"]),
                                        "content": st.one_of(st.text(max_size=40), st.none(), st.integers())}),
                 min_size=0, max_size=3)
SMALL = {"max_tokens": st.integers(1, 3), "max_completion_tokens": st.integers(1, 3), "n": st.integers(1, 2),
         "best_of": st.just(None), "min_tokens": st.integers(0, 2), "prompt_logprobs": st.integers(0, 2),
         "logprobs": st.integers(0, 2)}


@pytest.fixture(scope="module")
def body_strategies(server, http):
    spec = http.get("/openapi.json").json()
    components = spec.get("components", {}).get("schemas", {})
    return {path: from_schema(components[name], components) for path, name in ROUTES.items()}


@st.composite
def request_bodies(draw, strategies):
    path = draw(st.sampled_from(sorted(strategies)))
    body = draw(strategies[path])
    if draw(st.integers(0, 3)) == 0 and body:  # one field replaced by random JSON
        key = draw(st.sampled_from(sorted(body)))
        body[key] = draw(json_values)
    if path == "/v1/chat/completions" and draw(st.booleans()):
        body["messages"] = draw(chats)
    for key, small in SMALL.items():  # keep generation short; huge values are in the corpus
        if isinstance(body.get(key), int) and not isinstance(body.get(key), bool):
            body[key] = draw(small)
    if path in ("/v1/completions", "/v1/chat/completions"):
        # an absent or null length would generate up to max_model_len: always a few tokens
        for key in ("max_tokens", "max_completion_tokens") if "chat" in path else ("max_tokens",):
            if body.get(key) is None:
                body[key] = draw(st.integers(1, 3))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            body["prompt"] = prompt[:2]  # at most two prompts per request
    body.pop("model", None)
    return path, body


def test_schema_fuzz_never_5xx(server, body_strategies):
    seen = {"n": 0}
    with httpx.Client(base_url=server.url, timeout=60) as client:

        @settings(max_examples=TOTAL, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(request_bodies(body_strategies))
        def check(case):
            path, body = case
            seen["n"] += 1
            data = json.dumps(body, allow_nan=True).encode()  # NaN / Infinity literals too
            resp = client.post(path, content=data, headers={"content-type": "application/json"})
            assert resp.status_code < 500, (path, body, resp.text[:300])
            if resp.status_code >= 400:
                assert_openai_error(resp)

        check()
    print(f"schema fuzz: {seen['n']} requests, no 5xx")
    assert seen["n"] >= min(TOTAL, 5000) if FULL else seen["n"] >= TOTAL * 0.9
