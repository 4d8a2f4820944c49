"""XLM-RoBERTa through ``LLM``: ``XLMRobertaForSequenceClassification`` (3 labels: softmax, labels, raw logits)
and ``XLMRobertaModel`` sentence embeddings (positions offset by padding_idx + 1, usable context lowered to
match), both equal to transformers on the same tiny random weights (float64 reference).
"""

from __future__ import annotations

import pytest
import torch
import transformers as T

from octavo import PoolingParams
from tests.e2e.pooling_checkpoints import randomize, xlmr_classifier

TEXTS = ["apple", "banana cherry grape lemon mango melon olive", "sweet sour fresh juice"]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    from octavo import LLM

    path = str(tmp_path_factory.mktemp("xlmr"))
    ref, tok = xlmr_classifier(path)
    return LLM(path, dtype="float32"), ref.double(), tok


def test_xlmr_classify_matches_transformers(classifier):
    llm, ref, tok = classifier
    assert llm.llm_engine.model_info.max_model_len == 38  # 40 positions - (padding_idx + 1)
    with torch.no_grad():
        logits = torch.cat([ref(**tok(t, return_tensors="pt")).logits.double() for t in TEXTS])
    outs = llm.classify(TEXTS, use_tqdm=False)
    got = torch.tensor([o.outputs.probs for o in outs], dtype=torch.float64)
    assert torch.allclose(got, torch.softmax(logits, -1), atol=1e-5), (got, torch.softmax(logits, -1))
    assert outs[0].outputs.num_classes == 3
    raw = llm.classify(TEXTS, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    assert torch.allclose(torch.tensor([o.outputs.probs for o in raw], dtype=torch.float64), logits, atol=1e-4)
    assert (logits.max(0).values - logits.min(0).values).max().item() > 0.1  # inputs differ: the check can fail
    assert llm.llm_engine.model_info.pooler["id2label"] == {"0": "class_0", "1": "class_1", "2": "class_2"}
    with pytest.raises(ValueError, match="score"):  # several labels: not a cross-encoder, no embeddings either
        llm.score("apple", ["pear"], use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len|exceeds|long"):
        llm.classify([{"prompt_token_ids": [5] * 39}], use_tqdm=False)


def test_xlmr_sentence_embeddings(tmp_path):
    from octavo import LLM

    config = T.XLMRobertaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, max_position_embeddings=40, type_vocab_size=1, pad_token_id=1,
                                architectures=["XLMRobertaModel"])
    ref = randomize(T.XLMRobertaModel(config, add_pooling_layer=False), seed=4)
    ref.save_pretrained(tmp_path)
    from tests.e2e.pooling_checkpoints import bert_tokenizer

    bert_tokenizer(str(tmp_path))
    llm = LLM(str(tmp_path), dtype="float32")
    prompts = [[0, 7, 9, 2], [0, 5, 6, 7, 8, 12, 30, 2]]
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)  # no sentence-transformers files:
    raw = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False,  # CLS pooling, normalised
                    pooling_params=PoolingParams(normalize=False))
    for p, o, r in zip(prompts, outs, raw):
        with torch.no_grad():
            cls = ref.double()(torch.tensor([p])).last_hidden_state[0, 0]
        assert torch.allclose(torch.tensor(r.outputs.embedding, dtype=torch.float64), cls, atol=1e-4)
        assert torch.allclose(torch.tensor(o.outputs.embedding, dtype=torch.float64),
                              torch.nn.functional.normalize(cls, dim=0), atol=1e-5)
