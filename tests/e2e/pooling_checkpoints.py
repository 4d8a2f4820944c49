"""Tiny random-weight pooling checkpoints for the pooling tests, built with transformers (offline).

Each builder saves a real transformers model (and a real fast tokenizer) to a directory and returns the
transformers model as the reference. Weights are drawn with a wide spread (norm weights around 1) so
different inputs give clearly different outputs: a test that compares outputs can then fail.
"""

from __future__ import annotations

import torch
import transformers as T

#: the query and documents the cross-encoder tests score, offline and through the server
QUERY = "apple juice sweet"
DOCS = ["green apple tree", "ripe red cherry market", "lemon sour", "apple juice sweet fresh farm"]

WORDS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "melon", "olive", "peach", "pear", "plum", "kiwi",
         "red", "green", "blue", "yellow", "sweet", "sour", "ripe", "fresh", "tree", "farm", "market", "juice"]


def randomize(model: torch.nn.Module, seed: int, std: float = 0.3) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * std
            p.copy_(1.0 + noise if "norm" in name.lower() else noise)
    return model.eval()


def bert_tokenizer(path: str) -> T.PreTrainedTokenizerFast:
    """A real WordPiece tokenizer over ``WORDS``: ``[CLS] a [SEP] b [SEP]`` pairs, token type 1 on ``b``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    fast = T.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                                     cls_token="[CLS]", mask_token="[MASK]",
                                     model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    fast.save_pretrained(path)
    return fast


def bert_cross_encoder(path: str, num_labels: int = 1, seed: int = 0):
    """``BertForSequenceClassification`` (type_vocab_size 2, so pair token types matter) + its tokenizer."""
    tok = bert_tokenizer(path)
    config = T.BertConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, max_position_embeddings=64, num_labels=num_labels,
                          architectures=["BertForSequenceClassification"])
    ref = randomize(T.BertForSequenceClassification(config), seed, std=0.6)
    ref.save_pretrained(path)
    return ref, tok


def xlmr_classifier(path: str, num_labels: int = 3, seed: int = 1):
    """``XLMRobertaForSequenceClassification`` (positions offset by padding_idx + 1) with a WordPiece tokenizer."""
    tok = bert_tokenizer(path)
    config = T.XLMRobertaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, max_position_embeddings=40, type_vocab_size=1, pad_token_id=1,
                                num_labels=num_labels, id2label={i: f"class_{i}" for i in range(num_labels)},
                                label2id={f"class_{i}": i for i in range(num_labels)},
                                architectures=["XLMRobertaForSequenceClassification"])
    ref = randomize(T.XLMRobertaForSequenceClassification(config), seed)
    ref.save_pretrained(path)
    return ref, tok


def decoder_classifier(path: str, family: str = "llama", num_labels: int = 1, seed: int = 2):
    """``LlamaForSequenceClassification`` / ``Qwen2ForSequenceClassification`` (a reward model when 1 label)."""
    tok = bert_tokenizer(path)
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, num_labels=num_labels,
                  pad_token_id=0, tie_word_embeddings=False)
    if family == "llama":
        config = T.LlamaConfig(architectures=["LlamaForSequenceClassification"], **common)
        ref = T.LlamaForSequenceClassification(config)
    else:
        config = T.Qwen2Config(architectures=["Qwen2ForSequenceClassification"], **common)
        ref = T.Qwen2ForSequenceClassification(config)
    ref = randomize(ref, seed, std=0.2)
    ref.save_pretrained(path)
    return ref, tok


def reference_logits(ref, tok, a, b=None) -> torch.Tensor:
    """The transformers reference's logits, float64, for the texts ``a`` (paired with ``b`` when given)."""
    with torch.no_grad():
        return ref(**tok(a, b, padding=True, return_tensors="pt")).logits.double()
