"""Encoder classifiers and cross-encoders: ``BertForSequenceClassification``, ``XLMRobertaForSequenceClassification``
(and ``RobertaForSequenceClassification``), plus the ``XLMRobertaModel`` / ``RobertaModel`` embedding encoders.

Both heads read the first token's final state and run ``dense -> tanh -> out`` (BERT calls the first
projection its pooler, RoBERTa its classification head's ``dense``), so one class serves both with a
checkpoint-name table. ``pool`` returns the RAW logits ``[num_reqs, num_labels]``; the activation
(softmax / sigmoid, or the checkpoint's sentence-transformers ``activation_fn`` for scores) is applied per
request by the front end (``octavo.pooling``), which is how ``use_activation=False`` is honored.

Token types: a cross-encoder reads a (query, document) pair as ``[CLS] q [SEP] d [SEP]`` with token type 1
on the document. No per-token side channel crosses the step contract, so the model derives the types from
the ids: every token after a request's first ``[SEP]`` is type 1 -- exactly what the tokenizer's pair
template produces. RoBERTa-family checkpoints have one token type and no such rule.

RoBERTa positions start at ``padding_idx + 1`` (transformers' ``create_position_ids_from_input_ids`` without
padding), so the usable context is ``max_position_embeddings - padding_idx - 1``; the model lowers
``config.max_position_embeddings`` to that before the engine reads it as ``max_model_len``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import torch

from octavo.model import ForwardContext
from octavo.nn import ReplicatedLinear
from octavo.plugins.models.bert import BertModel

# sentence-transformers CrossEncoder ``activation_fn`` names -> octavo.pooling.ACTIVATIONS
_ST_ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity", "torch.nn.modules.activation.Sigmoid": "sigmoid",
                   "torch.nn.modules.activation.Tanh": "tanh", "torch.nn.Identity": "identity",
                   "torch.nn.Sigmoid": "sigmoid", "torch.nn.Tanh": "tanh"}


def classifier_info(config: Any, tasks: list[str]) -> dict:
    """``pooler_info`` of a classification head: labels, and the score activation the checkpoint declares."""
    num_labels = int(config.num_labels)
    name = (getattr(config, "sentence_transformers", None) or {}).get("activation_fn") \
        or getattr(config, "sbert_ce_default_activation_function", None)
    if name is not None and name not in _ST_ACTIVATIONS:
        raise ValueError(f"the checkpoint's sentence-transformers activation_fn {name!r} is not supported; "
                         f"known: {sorted(_ST_ACTIVATIONS)}")
    id2label = {str(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    return {"task": "classify", "tasks": tasks + (["score"] if num_labels == 1 else []), "num_labels": num_labels,
            "id2label": id2label, "score_activation": _ST_ACTIVATIONS.get(name) if name else None}


def sep_token_id(directory: str | None) -> int | None:
    """The ``[SEP]`` id from a checkpoint's tokenizer files (tokenizer.json, else vocab.txt), or None."""
    if not directory or not os.path.isdir(directory):
        return None
    sep = "[SEP]"
    path = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            value = json.load(f).get("sep_token", sep)
        sep = value.get("content", sep) if isinstance(value, dict) else (value or sep)
    path = os.path.join(directory, "tokenizer.json")
    if os.path.isfile(path):
        with open(path) as f:
            data = json.load(f)
        for token in data.get("added_tokens", []):
            if token.get("content") == sep:
                return int(token["id"])
        vocab = (data.get("model") or {}).get("vocab")
        if isinstance(vocab, dict) and sep in vocab:
            return int(vocab[sep])
    path = os.path.join(directory, "vocab.txt")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if line.rstrip("\n") == sep:
                    return i
    return None


class BertForSequenceClassification(BertModel):
    """BERT encoder + classification head; a pooling model (``classify``, and ``score`` with one label).

    Args:
        config: a transformers ``BertConfig`` with ``num_labels``.
        prefix: name prefix of this model's parameters.
    """

    _checkpoint_prefix = "bert."
    # checkpoint head names -> this model's
    _HEAD = {"bert.pooler.dense.": "head_dense.", "classifier.": "head_out."}
    position_offset = 0

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        super().__init__(config=config, prefix=prefix)
        hidden = config.hidden_size
        self.head_dense = ReplicatedLinear(hidden, hidden, bias=True, prefix="head_dense")
        self.head_out = ReplicatedLinear(hidden, int(config.num_labels), bias=True, prefix="head_out")
        self.sep_token_id = None
        if config.type_vocab_size > 1:
            directory = getattr(config, "_name_or_path", None)
            self.sep_token_id = sep_token_id(directory)
            if self.sep_token_id is None:
                raise ValueError(f"{type(self).__name__}: no [SEP] token found in the tokenizer files of {directory!r}; "
                                 "it is needed to give the second text of a pair token type 1")
        self.pooler_info = classifier_info(config, ["classify"])

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        x = torch.nn.functional.embedding(input_ids, self.word_embeddings)
        x = x + torch.nn.functional.embedding(positions + self.position_offset, self.position_embeddings)
        if self.sep_token_id is None:
            return x + self.token_type_embeddings[0]
        return x + self.token_type_embeddings[self._token_types(input_ids, ctx.query_start_loc)]

    def _token_types(self, input_ids: torch.Tensor, query_start_loc: torch.Tensor) -> torch.Tensor:
        """1 for tokens after their request's first [SEP], else 0 (flat batch, no host sync)."""
        is_sep = (input_ids == self.sep_token_id).long()  # [n]
        seen = torch.cumsum(is_sep, 0) - is_sep  # [SEP]s strictly before each token, over the whole batch
        lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
        starts = query_start_loc[:-1].long()
        before_request = torch.repeat_interleave(seen[starts], lens, output_size=input_ids.shape[0])
        return (seen - before_request > 0).long()  # [n]

    def pool(self, hidden_states: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``[n, hidden]`` -> ``[num_reqs, num_labels]`` raw logits from each request's first token."""
        first = hidden_states[ctx.query_start_loc[:-1].long()]  # [num_reqs, hidden]
        return self.head_out(torch.tanh(self.head_dense(first))).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def renamed():
            for name, tensor in weights:
                for old, new in self._HEAD.items():
                    if name.startswith(old):
                        name = new + name[len(old):]
                        break
                else:
                    if name.startswith(self._checkpoint_prefix):
                        name = "bert." + name[len(self._checkpoint_prefix):]  # BertModel strips "bert."
                yield name, tensor

        return super().load_weights(renamed())


class XLMRobertaForSequenceClassification(BertForSequenceClassification):
    """XLM-RoBERTa / RoBERTa classifiers and cross-encoders (bge-reranker, ms-marco cross-encoders)."""

    _checkpoint_prefix = "roberta."
    _HEAD = {"classifier.dense.": "head_dense.", "classifier.out_proj.": "head_out."}

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        super().__init__(config=config, prefix=prefix)
        self.position_offset = _roberta_positions(config)


class XLMRobertaModel(BertModel):
    """XLM-RoBERTa / RoBERTa sentence encoders (multilingual-e5, bge-m3 dense): BERT with shifted positions."""

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        super().__init__(config=config, prefix=prefix)
        self.position_offset = _roberta_positions(config)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return super().embed(input_ids, positions + self.position_offset, ctx)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights((("bert." + n[len("roberta."):] if n.startswith("roberta.") else n, t)
                                     for n, t in weights))


def _roberta_positions(config: Any) -> int:
    """Position offset (``padding_idx + 1``); lowers ``max_position_embeddings`` to the usable context."""
    offset = int(getattr(config, "pad_token_id", 1) or 0) + 1
    config.max_position_embeddings = config.max_position_embeddings - offset  # the engine's max_model_len
    return offset
