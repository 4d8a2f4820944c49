"""A BERT cross-encoder (``BertForSequenceClassification``, one label) through ``LLM``: ``score``, ``classify``,
``encode`` and ``PoolingParams`` equal transformers on the same tiny random weights (float64 reference), and
every field that cannot run is refused naming it. One model load for the module.
"""

from __future__ import annotations

import pytest
import torch

from octavo import PoolingParams
from tests.e2e.pooling_checkpoints import DOCS, QUERY, bert_cross_encoder, reference_logits


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("bert_ce"))
    ref, tok = bert_cross_encoder(path)
    return path, ref.double(), tok


@pytest.fixture(scope="module")
def setup(checkpoint):
    from octavo import LLM

    path, ref, tok = checkpoint
    return LLM(path, dtype="float32", max_model_len=64, task="score"), ref, tok  # vLLM's task names work


def test_score_pairs_match_transformers(setup):
    llm, ref, tok = setup
    logits = reference_logits(ref, tok, [QUERY] * len(DOCS), DOCS)[:, 0]
    outs = llm.score(QUERY, DOCS, use_tqdm=False)
    got = torch.tensor([o.outputs.score for o in outs], dtype=torch.float64)
    assert torch.allclose(got, torch.sigmoid(logits), rtol=1e-4, atol=1e-7), (got, torch.sigmoid(logits))
    raw = llm.score(QUERY, DOCS, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    got = torch.tensor([o.outputs.score for o in raw], dtype=torch.float64)
    assert torch.allclose(got, logits, atol=1e-4), (got, logits)
    assert (logits.max() - logits.min()).item() > 0.1  # the pairs differ: the comparison can fail
    # the document's token type 1 is applied: with every token type 0 transformers gives other logits
    batch = tok([QUERY] * len(DOCS), DOCS, padding=True, return_tensors="pt")
    batch["token_type_ids"].zero_()
    with torch.no_grad():
        type0 = ref(**batch).logits[:, 0].double()
    assert (type0 - got).abs().max().item() > 0.1
    # N:N pairs, and the prompt is the tokenizer's pair template
    pairs = llm.score(DOCS[:2], DOCS[2:], pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    assert pairs[0].prompt_token_ids == tok(DOCS[0], DOCS[2])["input_ids"]
    want = reference_logits(ref, tok, DOCS[:2], DOCS[2:])[:, 0]
    assert torch.allclose(torch.tensor([p.outputs.score for p in pairs], dtype=torch.float64), want, atol=1e-4)


def test_classify_and_use_activation(setup):
    llm, ref, tok = setup
    texts = ["apple", "banana cherry grape lemon", "sweet sour fresh"]
    logits = torch.cat([reference_logits(ref, tok, t) for t in texts])[:, 0]
    probs = llm.classify(texts, use_tqdm=False)
    assert [p.outputs.num_classes for p in probs] == [1, 1, 1]
    assert torch.allclose(torch.tensor([p.outputs.probs[0] for p in probs], dtype=torch.float64),
                          torch.sigmoid(logits), rtol=1e-4, atol=1e-7)
    raw = llm.classify(texts, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    assert torch.allclose(torch.tensor([r.outputs.probs[0] for r in raw], dtype=torch.float64), logits, atol=1e-4)
    old = llm.classify(texts[:1], pooling_params=PoolingParams(softmax=False), use_tqdm=False)  # deprecated alias
    assert abs(old[0].outputs.probs[0] - logits[0].item()) < 1e-4
    # truncate_prompt_tokens keeps the last k tokens
    ids = tok(texts[1])["input_ids"]
    cut = llm.classify([texts[1]], truncate_prompt_tokens=3, use_tqdm=False,
                       pooling_params=PoolingParams(use_activation=False))[0]
    assert cut.prompt_token_ids == ids[-3:]
    with torch.no_grad():
        want = ref(torch.tensor([ids[-3:]])).logits[0, 0].double()
    assert abs(cut.outputs.probs[0] - want.item()) < 1e-4


def test_encode_returns_tensors_and_ids_prompts(setup):
    llm, ref, tok = setup
    ids = tok("plum pear")["input_ids"]
    out = llm.encode([{"prompt_token_ids": ids}], use_tqdm=False)[0]
    assert isinstance(out.outputs.data, torch.Tensor) and out.outputs.data.shape == (1,)
    want = torch.sigmoid(reference_logits(ref, tok, "plum pear")[0, 0])
    assert abs(out.outputs.data[0].item() - want.item()) < 1e-4 * want.item()
    scored = llm.encode(["plum pear"], pooling_task="classify", use_tqdm=False)[0]
    assert scored.prompt_token_ids == ids
    import octavo.pooling_params
    from octavo.outputs import (  # vLLM's paths
        ClassificationRequestOutput,
        PoolingRequestOutput,
        ScoringRequestOutput,
    )

    assert octavo.pooling_params.PoolingParams is PoolingParams and isinstance(out, PoolingRequestOutput)
    assert isinstance(llm.classify(["plum"], use_tqdm=False)[0], ClassificationRequestOutput)
    assert isinstance(llm.score("plum", "pear", use_tqdm=False)[0], ScoringRequestOutput)


@pytest.mark.parametrize("params, call, field", [
    (PoolingParams(step_tag_id=3), "classify", "step_tag_id"),
    (PoolingParams(returned_token_ids=[1]), "classify", "returned_token_ids"),
    (PoolingParams(normalize=True), "classify", "normalize"),
    (PoolingParams(dimensions=8), "classify", "dimensions"),
    (PoolingParams(extra_kwargs={"a": 1}), "classify", "extra_kwargs"),
    (PoolingParams(task="embed"), "classify", "task"),
    (PoolingParams(use_activation=True, softmax=False), "classify", "softmax"),
    (PoolingParams(truncate_prompt_tokens=-2), "classify", "truncate_prompt_tokens"),
    (None, "embed", "embed"),
    (None, "reward", "reward"),
])
def test_refused_fields_and_tasks(setup, params, call, field):
    llm = setup[0]
    with pytest.raises(ValueError, match=field):
        getattr(llm, call)(["apple"], pooling_params=params, use_tqdm=False)
    with pytest.raises(ValueError, match="token_embed"):
        llm.encode(["apple"], pooling_task="token_embed", use_tqdm=False)
    with pytest.raises(ValueError, match="lora_request"):
        llm.classify(["apple"], lora_request=object(), use_tqdm=False)
    with pytest.raises(ValueError, match="data_1 has 2"):
        llm.score(["a", "b"], ["c", "d", "e"], use_tqdm=False)
    with pytest.raises(ValueError, match="embedding model"):
        llm.generate("apple")
    assert llm.classify(["apple"], use_tqdm=False)[0].finished  # the engine still serves


def _raw(llm, text: str, **fields) -> float:
    return llm.classify([text], pooling_params=PoolingParams(**fields), use_tqdm=False)[0].outputs.probs[0]


def _refused(llm, field: str, **fields) -> None:
    with pytest.raises(ValueError, match=field):
        llm.classify(["apple"], pooling_params=PoolingParams(**fields), use_tqdm=False)


# every PoolingParams field -> a check that it changes the result or is refused naming it (normalize and
# dimensions are honored on embedding models: tests/e2e/test_pooling_embed.py; here, on a classifier, refused)
FIELD_CHECKS = {
    "truncate_prompt_tokens": lambda llm: _raw(llm, "banana cherry grape", truncate_prompt_tokens=2) != _raw(
        llm, "banana cherry grape"),
    "use_activation": lambda llm: _raw(llm, "apple", use_activation=False) != _raw(llm, "apple"),
    "softmax": lambda llm: _raw(llm, "apple", softmax=False) != _raw(llm, "apple"),
    "activation": lambda llm: _raw(llm, "apple", activation=False) != _raw(llm, "apple"),
    "dimensions": lambda llm: _refused(llm, "dimensions", dimensions=4),
    "normalize": lambda llm: _refused(llm, "normalize", normalize=False),
    "step_tag_id": lambda llm: _refused(llm, "step_tag_id", step_tag_id=1),
    "returned_token_ids": lambda llm: _refused(llm, "returned_token_ids", returned_token_ids=[1]),
    "task": lambda llm: _refused(llm, "task", task="reward"),
    "requires_token_ids": lambda llm: _refused(llm, "requires_token_ids", requires_token_ids=True),
    "skip_reading_prefix_cache": lambda llm: _refused(llm, "skip_reading_prefix_cache", skip_reading_prefix_cache=True),
    "extra_kwargs": lambda llm: _refused(llm, "extra_kwargs", extra_kwargs={"x": 1}),
    "output_kind": lambda llm: _refused(llm, "output_kind", output_kind=0),
}


def test_every_pooling_params_field_is_honored_or_refused(setup):
    llm = setup[0]
    assert set(PoolingParams.__struct_fields__) == set(FIELD_CHECKS)  # a new field needs a check here
    for name, check in FIELD_CHECKS.items():
        assert check(llm) is not False, name


def test_runner_and_task_settings(checkpoint):
    """vLLM's ``runner`` / ``task`` engine arguments: contradictions and a model that cannot serve the task fail
    at start naming the setting; ``runner="pooling"`` on a generative architecture means last-token embeddings."""
    from octavo import LLM
    from octavo.config import OctavoSettings

    assert OctavoSettings.from_kwargs(runner="pooling").model.task == "embed"
    for kw in ({"runner": "pooling", "task": "generate"}, {"runner": "generate", "task": "classify"}):
        with pytest.raises(ValueError, match="runner"):
            OctavoSettings.from_kwargs(**kw)
    path = checkpoint[0]
    with pytest.raises(ValueError, match="task='reward'"):
        LLM(path, dtype="float32", max_model_len=64, task="reward")
    with pytest.raises(ValueError, match="runner='generate'"):
        LLM(path, dtype="float32", max_model_len=64, runner="generate")
