"""The pooling API on the real all-MiniLM-L6-v2 (an embedding model): ``LLM.score`` is the cosine similarity of
the two texts' embeddings (as vLLM), ``PoolingParams(normalize=False)`` returns the raw mean-pooled vector,
``encode`` gives vLLM's ``PoolingRequestOutput`` with a tensor, and ``classify`` is refused saying why. The
reference is transformers' mean pooling on the same weights. One model load.
"""

from __future__ import annotations

import pytest
import torch

from octavo import PoolingParams
from tests.e2e.test_embeddings import minilm_dir

pytestmark = pytest.mark.slow

QUERY = "Where is the capital of France?"
DOCS = ["Paris is the capital of France.", "The cat sits on the mat.", "France's capital city is Paris."]


@pytest.fixture(scope="module")
def setup():
    from transformers import AutoModel, AutoTokenizer

    from octavo import LLM

    tok = AutoTokenizer.from_pretrained(minilm_dir())
    ref = AutoModel.from_pretrained(minilm_dir(), dtype=torch.float64).eval()
    return LLM(minilm_dir(), dtype="float32"), ref, tok


def _mean_pooled(ref, tok, texts) -> torch.Tensor:
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = ref(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].double()
    return (hidden * mask).sum(1) / mask.sum(1)


def test_score_is_embedding_cosine(setup):
    llm, ref, tok = setup
    pooled = _mean_pooled(ref, tok, [QUERY, *DOCS])
    want = torch.nn.functional.cosine_similarity(pooled[:1], pooled[1:], dim=-1)
    outs = llm.score(QUERY, DOCS, use_tqdm=False)
    got = torch.tensor([o.outputs.score for o in outs], dtype=torch.float64)
    assert torch.allclose(got, want, atol=1e-5), (got, want)
    assert got[0] > got[1] and got[2] > got[1]  # the relevant documents score higher
    assert outs[0].prompt_token_ids == tok(QUERY)["input_ids"] + tok(DOCS[0])["input_ids"]


def test_normalize_false_encode_and_refusals(setup):
    llm, ref, tok = setup
    pooled = _mean_pooled(ref, tok, DOCS)
    raw = llm.embed(DOCS, pooling_params=PoolingParams(normalize=False), use_tqdm=False)
    got = torch.tensor([o.outputs.embedding for o in raw], dtype=torch.float64)
    assert torch.allclose(got, pooled, atol=1e-4) and got.norm(dim=-1).min() > 1.5  # really not unit length
    enc = llm.encode(DOCS[:1], use_tqdm=False)[0]
    assert isinstance(enc.outputs.data, torch.Tensor) and enc.outputs.data.shape == (384,)
    assert torch.allclose(enc.outputs.data.double(), torch.nn.functional.normalize(pooled[0], dim=0), atol=1e-5)
    assert llm.embed(DOCS[:1], use_tqdm=False)[0].outputs.hidden_size == 384
    with pytest.raises(ValueError, match="classify"):
        llm.classify(DOCS[:1], use_tqdm=False)
    with pytest.raises(ValueError, match="dimensions"):  # MiniLM declares no Matryoshka training
        llm.embed(DOCS[:1], pooling_params=PoolingParams(dimensions=128), use_tqdm=False)
    with pytest.raises(ValueError, match="use_activation"):
        llm.embed(DOCS[:1], pooling_params=PoolingParams(use_activation=True), use_tqdm=False)
