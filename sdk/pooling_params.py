"""``PoolingParams``: vLLM's per-request options for pooling models (embed, classify, score, reward).

Same field names and defaults as ``vllm.pooling_params.PoolingParams``, so vLLM scripts run unchanged. The
rule of the project holds field by field: a field is honored, or a request that sets it is refused with an
error naming it (``verify``). What each field does is applied in the front end (``octavo.pooling``), on
the raw vector the model's ``pool`` returns:

| field | status |
|---|---|
| truncate_prompt_tokens | honored: keep the last k prompt tokens (-1: max_model_len) |
| dimensions | honored for Matryoshka embedding models (truncate, then normalize) |
| normalize | honored (embed; default the model's, else True) |
| use_activation (softmax, activation: deprecated aliases) | honored (classify / score; default True) |
| task | checked against the call (``LLM.classify`` sets ``classify``); a mismatch is refused |
| output_kind | FINAL_ONLY only (as vLLM) |
| step_tag_id, returned_token_ids | refused: step pooling (process reward models) is not built |
| requires_token_ids, skip_reading_prefix_cache, extra_kwargs | internal in vLLM; refused when set |
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import msgspec

from octavo.sampling_params import RequestOutputKind

__all__ = ["PoolingParams", "POOLING_TASKS"]

# tasks octavo serves; vLLM's per-token tasks (token_embed, token_classify, encode, plugin) are refused by name
POOLING_TASKS = ("embed", "classify", "score", "reward")
_VALID = {"embed": ("dimensions", "normalize"), "classify": ("use_activation",), "score": ("use_activation",),
          "reward": ()}


class PoolingParams(msgspec.Struct, omit_defaults=True, array_like=True):
    """API parameters for pooling models (vLLM's names).

    Attributes:
        truncate_prompt_tokens: keep only the last k prompt tokens (-1: the model's maximum); None: no truncation.
        dimensions: truncate embeddings to this size (Matryoshka models only).
        normalize: L2-normalise embeddings (None: the model's default).
        use_activation: apply the classification activation (softmax / sigmoid) to the outputs (None: True).
        softmax, activation: deprecated aliases of ``use_activation`` (as in vLLM).
        task: the pooling task; set by the ``LLM`` method or server route that runs the request.
    """

    truncate_prompt_tokens: int | None = None
    dimensions: int | None = None
    normalize: bool | None = None
    softmax: bool | None = None
    activation: bool | None = None
    use_activation: bool | None = None
    step_tag_id: int | None = None
    returned_token_ids: list[int] | None = None
    task: str | None = None
    requires_token_ids: bool = False
    skip_reading_prefix_cache: bool | None = None
    extra_kwargs: dict[str, Any] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY

    def clone(self) -> PoolingParams:
        """A deep copy (requests never share a mutable params object)."""
        return deepcopy(self)

    def verify(self, task: str, pooler: dict | None = None) -> None:
        """Fix the task, fold the deprecated aliases, apply the model's defaults and refuse what cannot run.

        Args:
            task: ``embed``, ``classify``, ``score`` or ``reward``.
            pooler: the model's ``pooler_info`` (``ModelInfo.pooler``): its defaults and Matryoshka sizes.

        Raises:
            ValueError: a field this task or octavo does not support, named.
        """
        pooler = pooler or {}
        if task not in POOLING_TASKS:
            raise ValueError(f"pooling task {task!r} is not supported by octavo; supported: {list(POOLING_TASKS)} "
                             "(per-token pooling, e.g. token_embed / token_classify, is not built)")
        if self.task is None:
            self.task = task
        elif self.task != task:
            raise ValueError(f"PoolingParams.task={self.task!r} cannot be run as task {task!r}")
        for alias in ("softmax", "activation"):
            value = getattr(self, alias)
            if value is not None:
                if self.use_activation is not None and self.use_activation != value:
                    raise ValueError(f"PoolingParams: {alias}={value} contradicts use_activation={self.use_activation}")
                self.use_activation, self.softmax, self.activation = value, None, None
        refused = [name for name, value in (("step_tag_id", self.step_tag_id),
                                            ("returned_token_ids", self.returned_token_ids),
                                            ("requires_token_ids", self.requires_token_ids or None),
                                            ("skip_reading_prefix_cache", self.skip_reading_prefix_cache or None),
                                            ("extra_kwargs", self.extra_kwargs or None)) if value is not None]
        if refused:
            raise ValueError(f"PoolingParams: {refused} not supported by octavo (step pooling and vLLM's internal "
                             "fields are not built)")
        if self.output_kind != RequestOutputKind.FINAL_ONLY:
            raise ValueError("PoolingParams: output_kind must be FINAL_ONLY for pooling requests")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < -1:
            raise ValueError(f"PoolingParams: truncate_prompt_tokens={self.truncate_prompt_tokens} must be >= -1")
        invalid = [k for k in ("dimensions", "normalize", "use_activation")
                   if getattr(self, k) is not None and k not in _VALID[task]]
        if invalid:
            raise ValueError(f"Task {task} only supports {list(_VALID[task])} parameters, does not support {invalid}")
        if task == "embed":
            if self.normalize is None:
                self.normalize = bool(pooler.get("normalize", True))
            if self.dimensions is not None:
                self._check_dimensions(pooler)
        elif task in ("classify", "score") and self.use_activation is None:
            self.use_activation = True

    def _check_dimensions(self, pooler: dict) -> None:
        sizes, size = pooler.get("matryoshka_dimensions"), pooler.get("hidden_size")
        if not pooler.get("is_matryoshka") and not sizes:
            raise ValueError("PoolingParams: dimensions is not supported by this model (it declares no Matryoshka "
                             "training; changing output dimensions would give poor results)")
        if sizes and self.dimensions not in sizes:
            raise ValueError(f"PoolingParams: dimensions={self.dimensions} is not one of the model's Matryoshka "
                             f"dimensions {sizes}")
        if self.dimensions < 1 or (size is not None and self.dimensions > size):
            raise ValueError(f"PoolingParams: dimensions={self.dimensions} must be in 1..{size}")
