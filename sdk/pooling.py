"""Pooling requests in the front end: which tasks a model serves, and the per-request post-processing.

A pooling model's ``pool`` returns the RAW vector of each input (the pooled hidden state of an embedding
model, the logits of a classification head) and declares its defaults in ``pooler_info``, which reaches the
front end as ``ModelInfo.pooler``::

    {"task": "embed", "normalize": True, "hidden_size": 384, "matryoshka_dimensions": None}
    {"task": "classify", "tasks": ["classify", "score"], "num_labels": 1, "id2label": {...},
     "score_activation": "sigmoid"}

The front end (``FrontEnd.submit`` / ``process_outputs``) checks a request's ``PoolingParams`` against this
(``resolve``) and applies them to the raw vector when it arrives (``finish``): Matryoshka truncation, L2
normalisation, the classification activation. Doing it here, not in the model, is what lets one model
answer ``normalize=False`` or ``use_activation=False`` per request without the core knowing about either.
"""

from __future__ import annotations

import math
from typing import Any

from octavo.errors import InputError
from octavo.outputs import EmbeddingOutput, EmbeddingRequestOutput
from octavo.pooling_outputs import PoolingOutput, PoolingRequestOutput
from octavo.pooling_params import PoolingParams

__all__ = ["model_tasks", "resolve", "finish", "cosine", "pair_prompts", "check_served_task", "ACTIVATIONS"]


def _softmax(v: list[float]) -> list[float]:
    top = max(v)
    e = [math.exp(x - top) for x in v]
    total = sum(e)
    return [x / total for x in e]


def _sigmoid(v: list[float]) -> list[float]:
    return [1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x)) for x in v]


ACTIVATIONS = {"softmax": _softmax, "sigmoid": _sigmoid, "identity": list,
               "tanh": lambda v: [math.tanh(x) for x in v]}


def model_tasks(pooler: dict | None, is_pooling: bool) -> list[str]:
    """The pooling tasks a model serves (``[]`` for a generative model)."""
    if not is_pooling:
        return []
    pooler = pooler or {}
    if pooler.get("tasks"):
        return list(pooler["tasks"])
    return [pooler.get("task", "embed")]


def resolve(params: PoolingParams | None, task: str, model_info: Any) -> PoolingParams:
    """A verified copy of ``params`` for ``task`` on this model (defaults filled in).

    Raises:
        InputError: the model does not serve ``task``, or a field cannot be honored (named in the message).
    """
    tasks = model_tasks(getattr(model_info, "pooler", None), getattr(model_info, "is_pooling", False))
    if task not in tasks:
        kind = f"serves {tasks}" if tasks else "is a generative model"
        raise InputError(f"{model_info.architecture} {kind}; it cannot run the pooling task {task!r}.", "model")
    if params is None:
        params = PoolingParams()
    elif not isinstance(params, PoolingParams):
        raise InputError(f"pooling_params must be a PoolingParams, not {type(params).__name__}", "pooling_params")
    params = params.clone()
    try:
        params.verify(task, model_info.pooler)
    except ValueError as e:
        raise InputError(str(e), _field_of(str(e))) from None
    return params


def _field_of(message: str) -> str | None:
    for name in PoolingParams.__struct_fields__:
        if name in message:
            return name
    return None


def finish(out: Any, params: PoolingParams, pooler: dict) -> Any:
    """The raw pooled output of one request (an ``EmbeddingRequestOutput`` from the output processor) ->
    the request's result: ``EmbeddingRequestOutput`` for ``embed``, else ``PoolingRequestOutput`` (list data)."""
    raw = [float(x) for x in out.outputs.embedding]
    if params.task == "embed":
        vector = raw[:params.dimensions] if params.dimensions is not None else raw
        if params.normalize:
            norm = math.sqrt(sum(x * x for x in vector)) or 1.0
            vector = [x / norm for x in vector]
        return EmbeddingRequestOutput(out.request_id, out.prompt_token_ids, EmbeddingOutput(vector), out.finished)
    data = raw
    if params.task in ("classify", "score") and params.use_activation:
        data = ACTIVATIONS[activation_name(params.task, pooler, len(raw))](raw)
    return PoolingRequestOutput(out.request_id, PoolingOutput(data), out.prompt_token_ids, out.finished)


def activation_name(task: str, pooler: dict, num_labels: int) -> str:
    """vLLM's defaults: classify -> softmax (>= 2 labels) or sigmoid (1 label); score -> the checkpoint's
    sentence-transformers activation if it declares one, else sigmoid for 1 label, identity otherwise."""
    if task == "score":
        return pooler.get("score_activation") or ("sigmoid" if num_labels == 1 else "identity")
    return pooler.get("activation") or ("softmax" if num_labels >= 2 else "sigmoid")


def cosine(a: list[float], b: list[float]) -> float:
    """Cosine similarity of two vectors (``score`` on an embedding model)."""
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def pair_prompts(tokenizer: Any, left: list, right: list, param: str) -> list[dict]:
    """(text_1, text_2) pairs -> token-id prompts in the tokenizer's pair template (``[CLS] a [SEP] b [SEP]``,
    ``<s> a </s></s> b </s>``), which is what a cross-encoder was trained on."""
    if tokenizer is None:
        raise InputError("scoring text pairs needs the model's tokenizer (skip_tokenizer_init is set)", param)
    prompts = []
    for a, b in zip(left, right):
        if not isinstance(a, str) or not isinstance(b, str):
            raise InputError("a cross-encoder scores text pairs: both sides must be strings", param)
        prompts.append({"prompt_token_ids": list(tokenizer(a, b)["input_ids"])})
    return prompts


def check_served_task(settings: Any, model_info: Any) -> None:
    """At start (``FrontEnd``): ``task=classify|score|reward`` needs a model that serves it, and ``runner=generate``
    refuses a pooling model, each naming the setting (vLLM fails these at start too).

    Raises:
        ConfigError: the loaded model does not fit the setting.
    """
    from octavo.errors import ConfigError

    task, runner = settings.model.task, settings.model.runner
    tasks = model_tasks(getattr(model_info, "pooler", None), model_info.is_pooling)
    if task in ("classify", "score", "reward") and task not in tasks:
        kind = f"serves {tasks}" if tasks else "is a generative model"
        raise ConfigError(f"task={task!r}: {model_info.architecture} {kind}; see docs/pooling.md for the models "
                          "that serve each pooling task")
    if runner == "generate" and model_info.is_pooling:
        raise ConfigError(f"runner='generate': {model_info.architecture} is a pooling model ({tasks}); it cannot "
                          "generate text")
