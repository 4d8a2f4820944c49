"""The model's own sampling defaults, from its ``generation_config.json`` (vLLM's ``--generation-config``).

``generation_config="auto"`` (the default) reads the file beside the model's weights; ``"vllm"`` (or
``"octavo"``) ignores it; any other value is a directory holding one. Only sampling fields are taken, and
only those that differ from Hugging Face's own defaults (as vLLM does): ``temperature``, ``top_p``, ``top_k``,
``min_p``, ``repetition_penalty``, and ``max_new_tokens`` as ``max_tokens``. They fill what a request
leaves out: ``LLM.generate`` without ``sampling_params``, and server fields a client omits.
A GGUF file carries no generation config, so the embedded default model has none.
"""

from __future__ import annotations

import json
import os
from typing import Any

from octavo.errors import ConfigError

# generation_config.json key -> (SamplingParams field, Hugging Face's default: a value equal to it is not taken)
_FIELDS = {"temperature": ("temperature", 1.0), "top_p": ("top_p", 1.0), "top_k": ("top_k", 50),
           "min_p": ("min_p", None), "repetition_penalty": ("repetition_penalty", 1.0),
           "max_new_tokens": ("max_tokens", None)}


def _find(settings: Any) -> str | None:
    """Path of the generation_config.json to read, or None."""
    choice = settings.model.generation_config
    if choice in ("vllm", "octavo"):
        return None
    if choice != "auto":
        path = os.path.join(choice, "generation_config.json")
        if not os.path.isfile(path):
            raise ConfigError(f"generation_config={choice!r}: no generation_config.json there; give 'auto', "
                              "'vllm' or a directory holding one.")
        return path
    model = settings.model.model
    if model is None or model.endswith(".gguf"):
        return None
    if os.path.isdir(model):
        path = os.path.join(model, "generation_config.json")
        return path if os.path.isfile(path) else None
    try:  # a hub repo id: the file is in the local cache once the model was fetched
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "generation_config.json", revision=settings.model.revision)
    except Exception:  # noqa: BLE001 - not a repo id: no defaults
        return None
    return found if isinstance(found, str) else None


def generation_defaults(settings: Any) -> dict[str, Any]:
    """``{SamplingParams field: value}`` from the model's generation config ({} when there is none)."""
    path = _find(settings)
    if path is None:
        return {}
    with open(path) as f:
        data = json.load(f)
    out = {}
    for key, (field, hf_default) in _FIELDS.items():
        value = data.get(key)
        if value is not None and value != hf_default:
            out[field] = value
    return out
