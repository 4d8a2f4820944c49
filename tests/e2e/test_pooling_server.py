"""The pooling routes of a real ``octavo serve`` on loopback, serving a tiny random-weight BERT cross-encoder:
``/classify``, ``/score`` + ``/v1/score``, ``/rerank`` + ``/v1/rerank`` + ``/v2/rerank`` and ``/pooling`` in vLLM's
(Jina's, Cohere's) shapes, numbers equal to transformers (float64 reference), and the refusals (400 naming the
field or saying why the model cannot answer). One server for the module; the official ``openai`` client posts
to the custom routes (``client.post``) as scripts do.
"""

from __future__ import annotations

import base64
import struct

import httpx
import openai
import pytest
import torch

from octavo.server.launch import ServerProcess
from tests.e2e.pooling_checkpoints import DOCS, QUERY, bert_cross_encoder, reference_logits

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("bert_ce_server"))
    ref, tok = bert_cross_encoder(path)
    srv = ServerProcess([path, "--dtype", "float32", "--max-model-len", "64", "--uvicorn-log-level", "warning"]).start()
    yield srv, ref.double(), tok
    assert srv.stop() == 0


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def test_score_routes(served):
    srv, ref, tok = served
    want = torch.sigmoid(reference_logits(ref, tok, [QUERY] * len(DOCS), DOCS)[:, 0])
    for path in ("/score", "/v1/score"):
        r = post(srv, path, {"text_1": QUERY, "text_2": DOCS})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["id"].startswith("score-") and body["model"]
        assert [d["index"] for d in body["data"]] == [0, 1, 2, 3] and body["data"][0]["object"] == "score"
        got = torch.tensor([d["score"] for d in body["data"]], dtype=torch.float64)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-7), (got, want)
        assert body["usage"]["prompt_tokens"] == sum(len(tok(QUERY, d)["input_ids"]) for d in DOCS)
    raw = post(srv, "/score", {"text_1": DOCS[:2], "text_2": DOCS[2:], "use_activation": False}).json()
    assert torch.allclose(torch.tensor([d["score"] for d in raw["data"]], dtype=torch.float64),
                          reference_logits(ref, tok, DOCS[:2], DOCS[2:])[:, 0], atol=1e-4)


def test_rerank_routes_jina_and_cohere(served):
    srv, ref, tok = served
    scores = torch.sigmoid(reference_logits(ref, tok, [QUERY] * len(DOCS), DOCS)[:, 0]).tolist()
    order = sorted(range(len(DOCS)), key=lambda i: scores[i], reverse=True)
    for path in ("/rerank", "/v1/rerank"):
        body = post(srv, path, {"query": QUERY, "documents": DOCS, "top_n": 3}).json()
        assert [r["index"] for r in body["results"]] == order[:3]
        assert [r["document"]["text"] for r in body["results"]] == [DOCS[i] for i in order[:3]]
        assert all(abs(r["relevance_score"] - scores[r["index"]]) < 1e-4 * scores[r["index"]] for r in body["results"])
        assert body["usage"]["total_tokens"] > 0 and body["id"].startswith("rerank-")
    cohere = post(srv, "/v2/rerank", {"query": QUERY, "documents": [{"text": d} for d in DOCS],
                                      "return_documents": False}).json()
    assert [r["index"] for r in cohere["results"]] == order and "document" not in cohere["results"][0]


def test_classify_and_pooling_routes(served):
    srv, ref, tok = served
    texts = ["apple", "banana cherry grape"]
    logits = torch.cat([reference_logits(ref, tok, t)[:, 0] for t in texts])
    client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
    body = client.post("/classify", body={"input": texts}, cast_to=object)
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]
    assert body["data"][0]["label"] == "LABEL_0" and body["data"][0]["num_classes"] == 1
    got = torch.tensor([d["probs"][0] for d in body["data"]], dtype=torch.float64)
    assert torch.allclose(got, torch.sigmoid(logits), rtol=1e-4, atol=1e-7)
    ids = tok(texts[1])["input_ids"]
    pooled = post(srv, "/pooling", {"input": [ids], "use_activation": False}).json()
    assert pooled["data"][0]["object"] == "pooling" and pooled["usage"]["prompt_tokens"] == len(ids)
    assert abs(pooled["data"][0]["data"][0] - logits[1].item()) < 1e-4
    b64 = post(srv, "/pooling", {"input": texts[1], "encoding_format": "base64"}).json()["data"][0]["data"]
    value = struct.unpack("<f", base64.b64decode(b64))[0]
    assert abs(value - torch.sigmoid(logits[1]).item()) < 1e-4 * value
    cut = post(srv, "/classify", {"input": texts[1], "truncate_prompt_tokens": 2, "use_activation": False}).json()
    assert cut["usage"]["prompt_tokens"] == 2


@pytest.mark.parametrize("path, body, param", [
    ("/v1/embeddings", {"input": "apple"}, "model"),
    ("/pooling", {"input": "apple", "task": "embed"}, "model"),
    ("/pooling", {"input": "apple", "dimensions": 8}, "dimensions"),
    ("/pooling", {"input": "apple", "normalize": False}, "normalize"),
    ("/classify", {"input": "apple", "use_activation": True, "softmax": False}, "softmax"),
    ("/classify", {"input": "apple", "truncate_prompt_tokens": -5}, "truncate_prompt_tokens"),
    ("/classify", {"input": "apple", "embed_dtype": "float16"}, "embed_dtype"),
    ("/classify", {"input": []}, "input"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
    ("/rerank", {"query": "a", "documents": ["b"], "max_tokens_per_doc": 3}, "max_tokens_per_doc"),
    ("/rerank", {"query": "a", "documents": [{"title": "b"}]}, "documents"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "pooling model"),
])
def test_refusals_are_400_naming_the_field(served, path, body, param):
    srv = served[0]
    r = post(srv, path, body)
    assert r.status_code == 400, (path, body, r.text)
    err = r.json()["error"]
    assert err["message"]
    if param == "pooling model":  # generation on a classifier: says what it is instead
        assert "a pooling model (['classify', 'score'])" in err["message"], err
    elif param is not None:
        assert err.get("param") == param, err
    assert post(srv, "/classify", {"input": "apple"}).status_code == 200  # still serving


def _differs(srv, path: str, a: dict, b: dict) -> bool:
    ra, rb = post(srv, path, a), post(srv, path, b)
    assert ra.status_code == rb.status_code == 200, (ra.text, rb.text)
    strip = ("id", "created")
    return {k: v for k, v in ra.json().items() if k not in strip} != {k: v for k, v in rb.json().items()
                                                                      if k not in strip}


def _refused(srv, path: str, body: dict, field: str) -> bool:
    r = post(srv, path, body)
    return r.status_code in (400, 404) and r.json()["error"].get("param") in (field, None) and \
        field in r.json()["error"]["message"] + str(r.json()["error"].get("param"))


C, S, R, P = "/classify", "/score", "/rerank", "/pooling"
X = {"input": "banana cherry grape"}
# every declared field of the pooling request bodies -> proof that it changes the answer or is refused
BODY_CHECKS = {
    "model": lambda s: _refused(s, C, {**X, "model": "other"}, "model"),
    "truncate_prompt_tokens": lambda s: _differs(s, C, X, {**X, "truncate_prompt_tokens": 2}),
    "use_activation": lambda s: _differs(s, C, X, {**X, "use_activation": False}),
    "softmax": lambda s: _differs(s, C, X, {**X, "softmax": False}),
    "activation": lambda s: _differs(s, C, X, {**X, "activation": False}),
    "add_special_tokens": lambda s: _differs(s, C, X, {**X, "add_special_tokens": False}),
    "priority": lambda s: _refused(s, C, {**X, "priority": 3}, "priority"),  # fcfs server: refused, as vLLM
    "user": lambda s: post(s, C, {**X, "user": "u1"}).status_code == 200,  # OpenAI's end-user id: logged once
    "request_id": lambda s: post(s, C, {**X, "request_id": "mine-1"}).json()["id"] == "mine-1",
    "input": lambda s: _differs(s, C, X, {"input": "apple"}),
    "task": lambda s: _refused(s, P, {**X, "task": "reward"}, "model"),
    "encoding_format": lambda s: _differs(s, P, X, {**X, "encoding_format": "base64"}),
    "dimensions": lambda s: _refused(s, P, {**X, "dimensions": 4}, "dimensions"),
    "normalize": lambda s: _refused(s, P, {**X, "normalize": True}, "normalize"),
    "text_1": lambda s: _differs(s, S, {"text_1": "apple", "text_2": "kiwi"}, {"text_1": "pear", "text_2": "kiwi"}),
    "text_2": lambda s: _differs(s, S, {"text_1": "apple", "text_2": "kiwi"}, {"text_1": "apple", "text_2": "plum"}),
    "query": lambda s: _differs(s, R, {"query": "apple", "documents": DOCS}, {"query": "kiwi", "documents": DOCS}),
    "documents": lambda s: _differs(s, R, {"query": "apple", "documents": DOCS}, {"query": "apple",
                                                                                  "documents": DOCS[:2]}),
    "top_n": lambda s: _differs(s, R, {"query": "apple", "documents": DOCS}, {"query": "apple", "documents": DOCS,
                                                                              "top_n": 1}),
    "return_documents": lambda s: _differs(s, R, {"query": "apple", "documents": DOCS},
                                           {"query": "apple", "documents": DOCS, "return_documents": False}),
}


def test_every_pooling_body_field_is_honored_or_refused(served):
    from octavo.server.pooling_protocol import (
        ClassificationRequest,
        PoolingRequest,
        RerankRequest,
        ScoreRequest,
    )

    fields = {f for cls in (PoolingRequest, ClassificationRequest, ScoreRequest, RerankRequest)
              for f in cls.model_fields}
    assert fields == set(BODY_CHECKS)  # a new field needs a check here
    for name, check in BODY_CHECKS.items():
        assert check(served[0]), name
