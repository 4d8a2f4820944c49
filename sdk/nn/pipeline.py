"""Pipeline-parallel helpers for model plugins: which stage this process is and which layers it builds.

With ``pipeline_parallel_size = P`` the decoder layers are split into P contiguous ranges, one per stage
(process group of ``tensor_parallel_size`` ranks). A model that supports pipeline parallelism:

- builds its layer list with :func:`make_layers` (layers of other stages become :class:`PPMissingLayer`, so
  no weights are allocated for them) and keeps ``start_layer`` / ``end_layer``;
- builds the token embedding only where :func:`is_first_stage`, and the final norm and LM head only where
  :func:`is_last_stage` (:func:`build_lm_head` handles tied embeddings);
- in ``forward``, takes its input from :func:`stage_input` (``None`` on the first stage: embed the tokens)
  and, on every stage but the last, returns :class:`IntermediateTensors` instead of hidden states;
- skips checkpoint tensors of other stages on load (:func:`missing_prefixes`).

The worker process sets the stage once (:func:`set_pipeline_stage`) before the model is built; the model
runner moves the intermediate tensors between stages (``octavo.core.pp_runner``). One process, one model:
the stage is process-wide, like the tensor-parallel group in :mod:`octavo.nn.parallel`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

_STAGE = (0, 1)  # (this process's stage, number of stages); NOTE: process-wide, set once by the worker
_SPLIT_CALLS = [0]  # how many models split their layers with make_layers (the worker checks support)
INTERMEDIATE_KEY = "pp_intermediate"  # ForwardContext.extra key of a stage's received inputs


class IntermediateTensors(NamedTuple):
    """What one stage hands the next: the hidden states and the residual stream, both ``[n, hidden]``."""

    hidden_states: torch.Tensor
    residual: torch.Tensor


class PPMissingLayer(nn.Identity):
    """A placeholder for a module that lives on another pipeline stage (no parameters, never called)."""


def set_pipeline_stage(stage: int, num_stages: int) -> None:
    """Make this process pipeline stage ``stage`` of ``num_stages`` (the worker calls it once)."""
    global _STAGE
    if not 0 <= stage < num_stages:
        raise ValueError(f"pipeline stage {stage} is outside 0..{num_stages - 1}")
    _STAGE = (stage, num_stages)


def get_pp_rank() -> int:
    return _STAGE[0]


def get_pp_size() -> int:
    return _STAGE[1]


def is_first_stage() -> bool:
    return _STAGE[0] == 0


def is_last_stage() -> bool:
    return _STAGE[0] == _STAGE[1] - 1


def stage_layer_range(num_layers: int, stage: int | None = None, num_stages: int | None = None) -> tuple[int, int]:
    """``[start, end)`` of the layers ``stage`` runs: equal shares, the remainder one each to the stages
    before the last (the last one also holds the norm and the LM head)."""
    stage = get_pp_rank() if stage is None else stage
    num_stages = get_pp_size() if num_stages is None else num_stages
    if num_layers < num_stages:
        raise ValueError(f"num_hidden_layers={num_layers} cannot be split into pipeline_parallel_size="
                         f"{num_stages} stages; use at most {num_layers} stages")
    sizes = [num_layers // num_stages] * num_stages
    for i in range(num_layers % num_stages):
        sizes[-2 - i] += 1  # remainder < num_stages: never the last stage
    start = sum(sizes[:stage])
    return start, start + sizes[stage]


def make_layers(num_layers: int, build: Callable[[int], nn.Module]) -> tuple[int, int, nn.ModuleList]:
    """``(start, end, layers)``: ``build(i)`` for this stage's layers, :class:`PPMissingLayer` elsewhere, so
    layer indices (and checkpoint names) stay global."""
    start, end = stage_layer_range(num_layers)
    _SPLIT_CALLS[0] += 1
    return start, end, nn.ModuleList(build(i) if start <= i < end else PPMissingLayer() for i in range(num_layers))


def split_calls() -> int:
    """How many times :func:`make_layers` ran in this process (a model that never calls it cannot be split)."""
    return _SPLIT_CALLS[0]


def stage_input(ctx) -> IntermediateTensors | None:
    """The previous stage's :class:`IntermediateTensors` for this step, or ``None`` on the first stage."""
    return ctx.extra.get(INTERMEDIATE_KEY)


def build_lm_head(make_head: Callable[[], nn.Module], embedding: nn.Module, tie: bool) -> nn.Module:
    """The LM head on the last stage (tied to ``embedding`` when both live here), else a placeholder.

    On a last stage without the embedding, a tied head is its own parameter and the model's loader puts the
    checkpoint's embedding matrix into it (see :func:`tied_head_name`)."""
    if not is_last_stage():
        return PPMissingLayer()
    head = make_head()
    if tie and not isinstance(embedding, PPMissingLayer):
        head.tie_weights(embedding)
    return head


def tied_head_name(name: str, embed_name: str, embedding: nn.Module, head: nn.Module, tie: bool) -> str:
    """Checkpoint name ``embed_name`` loads into ``lm_head.weight`` on a last stage that has the tied head
    but not the embedding; every other name is returned unchanged."""
    if tie and name == embed_name and isinstance(embedding, PPMissingLayer) \
            and not isinstance(head, PPMissingLayer):
        return "lm_head.weight"
    return name


def missing_prefixes(model: nn.Module) -> tuple[str, ...]:
    """Name prefixes (``"model.layers.7."``) of the modules this stage does not hold: checkpoint tensors
    under them belong to another stage and are skipped on load."""
    return tuple(f"{name}." for name, module in model.named_modules() if isinstance(module, PPMissingLayer))
