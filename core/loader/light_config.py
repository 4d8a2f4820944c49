"""Model configs of the common decoder families without importing transformers (issues 17 and 18: start time).

Importing transformers to read a ``config.json`` costs 1-3 s on a CPU and ~10 s on the GPU hosts; for the
llama, mistral, qwen2, qwen3, qwen3_moe and mixtral families this module builds the same object from
``config_tables.json`` (each family's field defaults, generated from transformers by ``config_tables_gen.py``)
and a port of the families' ``__post_init__`` steps, in transformers 5.x order:

    family step (head_dim, num_key_value_heads, sliding_window / layer_types, mlp_only_layers)
    -> torch_dtype -> dtype (a torch.dtype), id2label / num_labels
    -> rope: rope_scaling or rope_parameters, + rope_theta / partial_rotary_factor, standardized
    -> generation parameters dropped, the other extra keys set (through attribute_map), legacy layer types renamed

Anything else takes transformers' path (:func:`light_config_applies` says which): other model types, remote
code (``auto_map``), nested sub-configs, ``hf_overrides``, and ``OCTAVO_LIGHT_CONFIG=0``.
``tests/unit/test_light_config.py`` compares every attribute with transformers' config for the tiny checkpoints
of each family, rope variants, the Llama-3-8B shape and the embedded GGUF.
"""

from __future__ import annotations

import copy
import json
import os
from functools import lru_cache
from typing import Any

_TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config_tables.json")
_NESTED_KEYS = ("text_config", "vision_config", "audio_config", "sub_configs", "auto_map")


@lru_cache(maxsize=1)
def tables() -> dict[str, Any]:
    with open(_TABLES) as f:
        return json.load(f)


def light_config_applies(config_dict: dict[str, Any], overrides: dict[str, Any] | None = None) -> bool:
    """True when :func:`light_config` gives what transformers would for this ``config.json`` dict."""
    from octavo.env_flags import env_switch

    if not env_switch("OCTAVO_LIGHT_CONFIG", True) or overrides:
        return False
    if config_dict.get("model_type") not in tables()["families"]:
        return False
    return not any(key in config_dict for key in _NESTED_KEYS)


class LightConfig:
    """A transformers-compatible config object: attributes, ``attribute_map`` aliases, ``get_text_config``,
    ``to_dict``, ``num_labels``, ``name_or_path``. Unknown attributes raise ``AttributeError`` as in transformers."""

    def __init__(self, model_type: str, attribute_map: dict[str, str]):
        object.__setattr__(self, "model_type", model_type)
        object.__setattr__(self, "attribute_map", attribute_map)

    def __setattr__(self, key: str, value: Any) -> None:
        object.__setattr__(self, self.attribute_map.get(key, key), value)

    def __getattr__(self, key: str) -> Any:  # only for names not set directly: the aliases
        amap = object.__getattribute__(self, "attribute_map")
        if key in amap:
            return object.__getattribute__(self, amap[key])
        raise AttributeError(f"{type(self).__name__} ({self.model_type}) has no attribute {key!r}")

    @property
    def num_labels(self) -> int | None:
        return len(self.id2label) if self.id2label is not None else None

    @num_labels.setter
    def num_labels(self, num_labels: int) -> None:  # as transformers: id2label is the stored fact
        if self.id2label is None or self.num_labels != num_labels:
            self.id2label = {i: f"LABEL_{i}" for i in range(num_labels)}
            self.label2id = dict(zip(self.id2label.values(), self.id2label.keys()))

    @property
    def name_or_path(self) -> str:
        return self._name_or_path

    @property
    def torch_dtype(self):
        return self.dtype

    @property
    def output_attentions(self) -> bool:
        return self._output_attentions

    @property
    def rope_scaling(self):  # transformers 5.x: an alias of rope_parameters (read-only here)
        return self.rope_parameters

    @property
    def use_return_dict(self) -> bool:
        return self.return_dict

    def get_text_config(self, decoder=None, encoder=None) -> LightConfig:
        return self

    def to_dict(self) -> dict[str, Any]:
        out = {k: copy.deepcopy(v) for k, v in vars(self).items() if k != "attribute_map"}
        if out.get("dtype") is not None and not isinstance(out["dtype"], str):
            out["dtype"] = str(out["dtype"]).removeprefix("torch.")
        out["output_attentions"] = out.pop("_output_attentions", False)
        return out

    def __repr__(self) -> str:
        return f"LightConfig({json.dumps(self.to_dict(), default=str, sort_keys=True)})"


def _family_post_init(cfg: LightConfig, model_type: str, extra: dict[str, Any]) -> None:
    """The family's own ``__post_init__`` (transformers 5.x), before the base class's."""
    if model_type in ("llama", "mistral") and cfg.head_dim is None:
        cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
    if model_type in ("qwen2", "qwen3", "qwen3_moe"):
        cfg.sliding_window = cfg.sliding_window if cfg.use_sliding_window else None
    if model_type != "qwen3_moe" and cfg.num_key_value_heads is None:
        cfg.num_key_value_heads = cfg.num_attention_heads
    if model_type in ("qwen2", "qwen3") and cfg.layer_types is None:
        cfg.layer_types = ["sliding_attention" if cfg.sliding_window is not None and i >= cfg.max_window_layers
                           else "full_attention" for i in range(cfg.num_hidden_layers)]
    if model_type == "qwen3_moe" and cfg.mlp_only_layers is None:
        cfg.mlp_only_layers = []


def _rope(cfg: LightConfig, family: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """``convert_rope_params_to_dict`` + ``standardize_rope_params`` for flat (not per-layer-type) parameters."""
    rope_scaling = kwargs.pop("rope_scaling", None)
    params = rope_scaling or cfg.rope_parameters
    params = params if params is not None else {}
    theta = kwargs.pop("rope_theta", family["default_theta"])
    partial = kwargs.pop("partial_rotary_factor", None)
    labels = getattr(cfg, "layer_types", None) or ()
    if any(key in labels for key in params):
        raise _NotLight("per-layer-type rope parameters")
    params.setdefault("rope_theta", theta)
    if partial is not None:
        params.setdefault("partial_rotary_factor", partial)
        cfg.ignore_keys_at_rope_validation = {"partial_rotary_factor"}
    # standardize_rope_params: rope_theta / partial_rotary_factor are not attributes here (they were popped)
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", None)
    if family["default_rope_type"] != "default" and params["rope_type"] == "default":
        params["rope_type"] = family["default_rope_type"]
    if params["rope_type"] in ("llama3", "yarn", "longrope"):
        params.setdefault("original_max_position_embeddings", cfg.max_position_embeddings)
    cfg.rope_parameters = params


class _NotLight(Exception):
    """This config needs transformers' own class (raised while building; the caller falls back)."""


def light_config(config_dict: dict[str, Any], name_or_path: str = "") -> LightConfig | None:
    """The config transformers' ``AutoConfig`` would build from ``config_dict``, or None where it must be used.

    Raises:
        ValueError: what transformers' validation raises for these families (heads not dividing the hidden size,
            ``layer_types`` of the wrong length or an unknown type).
    """
    kwargs = copy.deepcopy(config_dict)
    model_type = kwargs.pop("model_type")
    family = tables()["families"][model_type]
    cfg = LightConfig(model_type, family["attribute_map"])
    fields = family["fields"]
    for name, default in fields.items():  # the dataclass __init__: fields from kwargs, else their defaults
        setattr(cfg, name, kwargs.pop(name) if name in kwargs else copy.deepcopy(default))
    try:
        _family_post_init(cfg, model_type, kwargs)
        _base_post_init(cfg, family, kwargs, name_or_path)
    except _NotLight:
        return None
    _validate(cfg, model_type)
    return cfg


def _base_post_init(cfg: LightConfig, family: dict[str, Any], kwargs: dict[str, Any], name_or_path: str) -> None:
    torch_dtype = kwargs.pop("torch_dtype", None)
    if torch_dtype is not None:
        cfg.dtype = cfg.dtype if cfg.dtype is not None else torch_dtype
    if isinstance(cfg.dtype, str):
        import torch

        cfg.dtype = getattr(torch, cfg.dtype)
    if cfg.id2label is None:
        cfg.num_labels = kwargs.get("num_labels", 2)
    else:
        cfg.id2label = {int(k): v for k, v in cfg.id2label.items()}
    if cfg.problem_type == "single_label_classification" and cfg.num_labels == 1:
        raise ValueError('`problem_type="single_label_classification"` requires `num_labels > 1`')
    _rope(cfg, family, kwargs)
    for key in tables()["generation_keys"]:
        kwargs.pop(key, None)
    cfg._name_or_path = str(kwargs.pop("name_or_path", name_or_path))
    kwargs.pop("_commit_hash", None)
    cfg._output_attentions = kwargs.pop("output_attentions", False)
    for key in ("attn_implementation", "experts_implementation"):
        kwargs.pop(key, None)
    if "per_layer_config" in kwargs:
        raise _NotLight("per_layer_config")
    for key, value in kwargs.items():
        if key not in ("_attn_implementation_internal", "_experts_implementation_internal"):
            setattr(cfg, key, value)
    if name_or_path:  # from_pretrained records the directory it read, whatever config.json says
        cfg._name_or_path = str(name_or_path)
    remap = tables()["legacy_layer_types"]
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = [remap.get(t, t) for t in cfg.layer_types]


def _validate(cfg: LightConfig, model_type: str) -> None:
    if model_type == "llama" and cfg.hidden_size % cfg.num_attention_heads != 0:
        raise ValueError(f"The hidden size ({cfg.hidden_size}) is not a multiple of the number of attention heads "
                         f"({cfg.num_attention_heads}).")
    layers = getattr(cfg, "layer_types", None)
    if layers is not None:
        allowed = tables()["allowed_attn_layer_types"]
        if not all(t in allowed for t in layers):
            raise ValueError(f"The `layer_types` entries must be in {allowed} but got {layers}")
        if len(layers) != cfg.num_hidden_layers:
            raise ValueError(f"`num_hidden_layers` ({cfg.num_hidden_layers}) must be equal to the number of "
                             f"`layer_types` ({len(layers)})")


def causal_lm_architecture(model_type: str) -> str | None:
    """transformers' causal-LM class name for a light family's model_type (None: not a light family)."""
    family = tables()["families"].get(model_type)
    return family["causal_lm"] if family else None


def gguf_mapping(model_type: str) -> dict[str, str | None] | None:
    """transformers' GGUF metadata -> config key mapping for a light family (None: not one)."""
    family = tables()["families"].get(model_type)
    return family["gguf"] if family else None
