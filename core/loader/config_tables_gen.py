"""Writes ``config_tables.json``, the transformers facts the light config path needs (dev tool, not run at start).

Why: importing transformers costs 1-3 s on a CPU and ~10 s on the GPU hosts (``resolve_model`` was 9.7 s of a
26 s ``LLM(...)`` start, issue 17). :mod:`octavo.core.loader.light_config` builds the config of the common
decoder families without it, from these tables: each family's dataclass field defaults, ``attribute_map`` and
rope defaults, the keys ``PreTrainedConfig`` drops (generation parameters), the legacy layer-type names, the
GGUF metadata mapping and the causal-LM class names. ``tests/unit/test_light_config.py`` regenerates them from
the installed transformers and fails if they differ, so a transformers upgrade that changes a default is seen.

    python -m octavo.core.loader.config_tables_gen      # rewrites core/loader/config_tables.json
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

#: model_type -> transformers config class name. Only families whose ``__post_init__`` light_config.py ports.
LIGHT_FAMILIES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config",
                  "qwen3": "Qwen3Config", "qwen3_moe": "Qwen3MoeConfig", "mixtral": "MixtralConfig"}

TABLES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config_tables.json")


def _defaults(cls) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # pragma: no cover - none of the families has one
            out[f.name] = f.default_factory()
        else:  # pragma: no cover
            raise ValueError(f"{cls.__name__}.{f.name} has no default")
    return out


def generate() -> dict[str, Any]:
    """The tables, from the installed transformers."""
    import transformers
    from transformers import configuration_utils as cu
    from transformers.generation.configuration_utils import GenerationConfig
    from transformers.integrations import GGUF_CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    families = {}
    for model_type, cls_name in LIGHT_FAMILIES.items():
        cls = getattr(transformers, cls_name)
        families[model_type] = {
            "fields": _defaults(cls),
            "attribute_map": dict(cls.attribute_map),
            "default_theta": float(cls.default_theta),
            "default_rope_type": cls.default_rope_type,
            "causal_lm": MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type),
            "gguf": GGUF_CONFIG_MAPPING.get(model_type),
        }
    return {
        "transformers_version": transformers.__version__,
        "generation_keys": sorted(GenerationConfig._get_default_generation_params()),
        "legacy_layer_types": dict(cu._LEGACY_LAYER_TYPE_REMAP),
        "allowed_attn_layer_types": list(cu.ALLOWED_ATTN_LAYER_TYPES),
        "families": families,
    }


if __name__ == "__main__":
    with open(TABLES_PATH, "w") as f:
        json.dump(generate(), f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", TABLES_PATH)
