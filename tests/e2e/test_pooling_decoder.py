"""Decoder reward models / classifiers: ``LlamaForSequenceClassification`` (one label) through
``LLM.reward``, ``classify`` and ``score``: equal to transformers on the same tiny random weights (float64
reference), alone and in one batch of different lengths (last-token pooling).
Qwen2 / Qwen3 / Mistral classifiers run on token-id prompts (transformers 5 loads those directories' tokenizers
as their own BPE classes, which drop this test's WordPiece words).
"""

from __future__ import annotations

import pytest
import torch

from octavo import PoolingParams
from tests.e2e.pooling_checkpoints import decoder_classifier

PREFIX = "apple banana cherry grape lemon mango melon olive peach pear plum kiwi red green blue yellow"
TEXTS = [PREFIX + " sweet", PREFIX + " sour fresh tree", "farm market", PREFIX + " juice"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from octavo import LLM

    path = str(tmp_path_factory.mktemp("llama_rm"))
    ref, tok = decoder_classifier(path, family="llama", num_labels=1)
    llm = LLM(path, dtype="float32", max_model_len=64)
    return llm, ref.double(), tok


def _reward(ref, ids: list[int]) -> float:
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0, 0].item()


def test_reward_matches_transformers(setup):
    llm, ref, tok = setup
    first = llm.reward(TEXTS[:1], use_tqdm=False)
    outs = llm.reward(TEXTS, use_tqdm=False)
    want = torch.tensor([_reward(ref, tok(t)["input_ids"]) for t in TEXTS], dtype=torch.float64)
    got = torch.stack([o.outputs.data.double() for o in outs])[:, 0]
    assert torch.allclose(got, want, atol=1e-4), (got, want)
    assert abs(first[0].outputs.data[0].item() - want[0].item()) < 1e-4
    assert (want.max() - want.min()).item() > 0.1


def test_classify_and_score(setup):
    llm, ref, tok = setup
    probs = llm.classify(TEXTS[2:], use_tqdm=False)
    want = torch.sigmoid(torch.tensor([_reward(ref, tok(t)["input_ids"]) for t in TEXTS[2:]], dtype=torch.float64))
    assert torch.allclose(torch.tensor([p.outputs.probs[0] for p in probs], dtype=torch.float64), want, atol=1e-5)
    scores = llm.score("apple", ["farm", "juice"], use_tqdm=False,
                       pooling_params=PoolingParams(use_activation=False))
    want = [_reward(ref, tok("apple", d)["input_ids"]) for d in ("farm", "juice")]
    assert [round(s.outputs.score, 4) for s in scores] == [round(w, 4) for w in want]
    with pytest.raises(ValueError, match="use_activation"):
        llm.reward(["apple"], pooling_params=PoolingParams(use_activation=True), use_tqdm=False)


@pytest.mark.parametrize("family", ["Qwen2", "Qwen3", "Mistral"])
def test_other_decoder_families_classify(tmp_path, family):
    """The other registered decoder classifiers (2 labels, token-id prompts): raw logits equal transformers'."""
    import transformers as T

    from octavo import LLM
    from tests.e2e.pooling_checkpoints import bert_tokenizer, randomize

    bert_tokenizer(str(tmp_path))
    config = getattr(T, f"{family}Config")(
        architectures=[f"{family}ForSequenceClassification"], vocab_size=29, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, num_labels=2,
        pad_token_id=0, tie_word_embeddings=False)
    ref = randomize(getattr(T, f"{family}ForSequenceClassification")(config), seed=5, std=0.2)
    ref.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=64)
    prompts = [[2, 5, 6, 7, 3], [2, 9, 10, 3]]
    outs = llm.classify([{"prompt_token_ids": p} for p in prompts], use_tqdm=False,
                        pooling_params=PoolingParams(use_activation=False))
    with torch.no_grad():
        want = torch.cat([ref.double()(torch.tensor([p])).logits for p in prompts])
    assert torch.allclose(torch.tensor([o.outputs.probs for o in outs], dtype=torch.float64), want, atol=1e-4)
