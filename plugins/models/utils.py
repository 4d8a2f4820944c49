"""Helpers shared by the built-in model plugins: last-token pooling and loading of per-expert MoE weights.

Kept out of ``octavo.nn`` on purpose: these are conventions of the built-in models, not layers a
third-party model must use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from octavo.model import ForwardContext
from octavo.nn.pipeline import missing_prefixes

# "model.layers.3.mlp.experts.7.gate_proj.weight" -> (".../mlp.experts", "7", "gate_proj")
_EXPERT_RE = re.compile(r"^(.*\.experts)\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
# checkpoint projection -> (FusedMoE parameter, shard id)
_EXPERT_PARAMS = {"w1": ("w13_weight", "w1"), "gate_proj": ("w13_weight", "w1"),
                  "w3": ("w13_weight", "w3"), "up_proj": ("w13_weight", "w3"),
                  "w2": ("w2_weight", "w2"), "down_proj": ("w2_weight", "w2")}


class LastTokenPooler:
    """Mixin: ``pool`` = the final hidden state of each request's last token (raw; the front end
    L2-normalises it by default, ``pooler_info``, unless a request's ``PoolingParams(normalize=False)``).

    Used when a decoder runs with ``task="embed"`` (Qwen3-Embedding, E5-Mistral style models): the engine
    schedules pooling requests whole, so the last token of each request's slice is its last prompt token.
    """

    pooler_info = {"task": "embed", "tasks": ["embed"], "normalize": True}

    def pool(self, hidden_states: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        last = ctx.query_start_loc[1:].long() - 1  # [num_reqs]
        return hidden_states[last].float()  # [num_reqs, hidden]


def split_expert_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                         loaded: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Load per-expert checkpoint tensors into the model's ``FusedMoE`` layers; yield every other tensor.

    Args:
        model: a model whose ``FusedMoE`` layers are named ``<block>.experts``.
        weights: the checkpoint's ``(name, tensor)`` pairs.
        loaded: receives the names of the fused parameters that were filled.
    """
    params = dict(model.named_parameters())
    other_stage = missing_prefixes(model)  # pipeline parallelism: experts of layers another stage holds
    for name, tensor in weights:
        match = _EXPERT_RE.match(name)
        if match is None:
            yield name, tensor
            continue
        if other_stage and name.startswith(other_stage):
            continue
        block, expert, proj = match.groups()
        param_name, shard_id = _EXPERT_PARAMS[proj]
        target = f"{block}.{param_name}"
        if target not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no matching expert parameter ({target!r}); "
                             "is the checkpoint's config.json the right one?")
        param = params[target]
        param.weight_loader(param, tensor, shard_id=shard_id, expert_id=int(expert))
        loaded.add(target)


def forward_with_image_embeds(language_model: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor,
                              ctx: ForwardContext) -> torch.Tensor:
    """A vision-language model's text stack: token embeddings, the step's image embeddings copied in at their
    placeholder rows (``ctx.extra["mm_embeds"] = (index, embeds)``), the decoder layers, the final norm."""
    lm = language_model.model
    hidden = lm.embed_tokens(input_ids)  # [n, hidden]
    mm = ctx.extra.get("mm_embeds")
    if mm is not None:
        index, embeds = mm
        hidden = hidden.index_copy(0, index, embeds.to(hidden.dtype))
    residual = None
    for layer in lm.layers:
        hidden, residual = layer(positions, hidden, residual, ctx)
    hidden, _ = lm.norm(hidden, residual)
    return hidden
