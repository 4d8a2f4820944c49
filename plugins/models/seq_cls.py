"""Decoder classifiers and reward models: ``<Family>ForSequenceClassification`` (Llama, Mistral, Qwen2, Qwen3).

transformers' ``*ForSequenceClassification`` on a decoder is the causal backbone plus ``score``, a bias-free
``hidden -> num_labels`` projection read at each sequence's last token; reward models such as
Skywork-Reward-Llama ship in exactly this form (one label, the raw logit is the reward). vLLM serves them
as pooling models; so does octavo: the backbone is the family's own model plugin (same paged attention and
weight loading), the LM head is dropped, and ``pool`` returns the raw ``[num_reqs, num_labels]`` scores of
each request's last token (the engine schedules pooling requests whole).

Tasks: ``classify`` (softmax / sigmoid in the front end), ``reward`` (raw scores) and, with one label,
``score`` (sequence-pair relevance). Per-token reward heads (vLLM's ``Qwen2ForRewardModel``, ALL pooling)
are not built: they are not registered, so loading one fails naming the architecture.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from octavo.model import ForwardContext
from octavo.nn import ReplicatedLinear
from octavo.plugins.models.bert_classify import classifier_info


class DecoderForSequenceClassification(nn.Module):
    """A causal family's backbone (``self.model``, checkpoint names unchanged) + ``score`` at the last token.

    Subclasses name the causal plugin class in ``causal_target`` (``"module:Class"``).
    """

    causal_target = ""

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        super().__init__()
        module, _, cls_name = self.causal_target.partition(":")
        causal = getattr(importlib.import_module(module), cls_name)(config=config, prefix=prefix)
        causal.lm_head = nn.Module()  # a classifier has no LM head (its checkpoint ships none): an empty slot
        self.packed_modules_mapping = getattr(causal, "packed_modules_mapping", {})
        self.model = causal.model  # checkpoint names "model.layers.*" load as they are
        self.__dict__["_causal"] = causal  # not a submodule: only its load_weights is reused
        self.score = ReplicatedLinear(config.hidden_size, int(config.num_labels), bias=False, prefix="score")
        self.pooler_info = classifier_info(config, ["classify", "reward"])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``[n]`` token ids and positions -> ``[n, hidden_size]`` final hidden states."""
        return self.model(input_ids, positions, ctx)

    def pool(self, hidden_states: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``[n, hidden]`` -> ``[num_reqs, num_labels]``: the score head on each request's last token (raw)."""
        last = ctx.query_start_loc[1:].long() - 1  # [num_reqs]
        return self.score(hidden_states[last]).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The backbone through the causal plugin's loader; ``score.weight`` here."""
        loaded: set[str] = set()

        def backbone():
            for name, tensor in weights:
                if name == "score.weight":
                    self.score.weight_loader(self.score.weight, tensor)
                    loaded.add(name)
                elif name.startswith("lm_head."):
                    raise ValueError(f"checkpoint tensor {name!r}: a sequence classifier has no LM head")
                else:
                    yield name, tensor

        loaded |= {n for n in self._causal.load_weights(backbone()) if not n.startswith("lm_head.")}
        return loaded


class LlamaForSequenceClassification(DecoderForSequenceClassification):
    causal_target = "octavo.plugins.models.llama:LlamaForCausalLM"


class MistralForSequenceClassification(DecoderForSequenceClassification):
    causal_target = "octavo.plugins.models.llama:MistralForCausalLM"


class Qwen2ForSequenceClassification(DecoderForSequenceClassification):
    causal_target = "octavo.plugins.models.llama:Qwen2ForCausalLM"


class Qwen3ForSequenceClassification(DecoderForSequenceClassification):
    causal_target = "octavo.plugins.models.qwen3:Qwen3ForCausalLM"
