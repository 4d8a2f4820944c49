"""Which quantizer a model loads with: the ``quantization`` setting or the checkpoint's own, never silent.

    setting     checkpoint (config.json quantization_config / GGUF tensor types)     result
    None        dense                                                                 dense
    None        method M                                                              M (M must be registered)
    "none"      GGUF with quantized tensors                                           dequantized to the dtype
    X           dense                                                                 X if X quantizes dense weights
    X           method M                                                              X if X == M, else error
    any         -                                                                     error if X cannot run here

Every error names the registered quantizers and the ones this platform can run.
"""

from __future__ import annotations

import logging
from typing import Any

from octavo.core.loader.resolve import ResolvedModel

logger = logging.getLogger(__name__)

_GGUF_FLOAT_TYPES = {0, 1, 30}


def checkpoint_quant_config(resolved: ResolvedModel) -> dict[str, Any] | None:
    """The checkpoint's quantization config: config.json's ``quantization_config``, or for a GGUF file
    ``{"quant_method": "gguf", "tensor_types": ...}`` when any weight outside the embedding is quantized."""
    if resolved.format == "gguf":
        from octavo.core.loader.gguf_file import read_header, tensor_types

        types = tensor_types(resolved.gguf_path)
        quantized = {n: t for n, t in types.items() if t not in _GGUF_FLOAT_TYPES and not n.endswith("embed_tokens")}
        if not quantized:
            return None
        file_type = read_header(resolved.gguf_path).metadata.get("general.file_type")
        return {"quant_method": "gguf", "tensor_types": types, "file_type": file_type}
    config = getattr(resolved.hf_config, "quantization_config", None)
    if config is None:
        return None
    config = config if isinstance(config, dict) else config.to_dict()
    if "quant_method" not in config:
        raise ValueError(f"{resolved.source}: quantization_config has no quant_method ({sorted(config)})")
    return dict(config)


def _platform_summary(pm, platform) -> str:
    names = pm.names("quantizers")
    runnable = []
    for name in names:
        try:
            cls = pm.resolve("quantizers", name)
            if platform.device_type in getattr(cls, "device_types", ()):
                runnable.append(name)
        except Exception:  # noqa: BLE001 - a broken plugin is listed as registered, not runnable
            continue
    return (f"Registered quantizers: {', '.join(names) or 'none'}; on this platform ({platform.name}, "
            f"{platform.device_type}): {', '.join(runnable) or 'none'}.")


def resolve_quantizer(quantization: str | None, resolved: ResolvedModel, platform, pm=None):
    """The :class:`octavo.Quantizer` to load ``resolved`` with, or None for dense weights.

    Args:
        quantization: the ``quantization`` setting (vLLM's names), ``"none"``, or None for the checkpoint's own.
        resolved: the located model.
        platform: the :class:`octavo.Platform` the model will run on.

    Raises:
        ValueError: unknown method, a method that does not fit the checkpoint, or one the platform cannot run.
    """
    if pm is None:
        from octavo.core.plugin_manager import get_plugin_manager

        pm = get_plugin_manager()
    ckpt = checkpoint_quant_config(resolved)
    ckpt_method = ckpt["quant_method"] if ckpt else None
    if quantization == "none":
        if ckpt_method not in (None, "gguf"):
            raise ValueError(f"quantization='none': {resolved.source} is a {ckpt_method} checkpoint, which octavo "
                             f"runs only quantized; drop the setting. {_platform_summary(pm, platform)}")
        return None
    name = quantization or ckpt_method
    if name is None:
        return None
    if name not in pm.names("quantizers"):
        where = "the quantization setting" if quantization else "the checkpoint's quantization_config"
        raise ValueError(f"Unknown quantization method {name!r} (from {where}). {_platform_summary(pm, platform)}")
    cls = pm.resolve("quantizers", name)
    if ckpt_method is None and not getattr(cls, "quantizes_dense", False):
        dense = [n for n in pm.names("quantizers") if getattr(pm.resolve("quantizers", n), "quantizes_dense", False)]
        raise ValueError(f"quantization={name!r} needs a checkpoint saved in the {name} format, but "
                         f"{resolved.source} is dense (no quantization_config). Methods that quantize a dense "
                         f"checkpoint while loading: {', '.join(dense)}. {_platform_summary(pm, platform)}")
    if ckpt_method is not None and name != ckpt_method:
        hint = " (or quantization='none' to dequantize it)" if ckpt_method == "gguf" else ""
        raise ValueError(f"quantization={name!r} does not fit {resolved.source}, which is quantized with "
                         f"{ckpt_method!r}; drop the setting or set quantization={ckpt_method!r}{hint}.")
    quantizer = cls.from_config(ckpt if ckpt else {"quant_method": name})
    available = quantizer.supports(platform)
    if not available:
        raise ValueError(f"quantization {name!r} cannot run on platform {platform.name}: "
                         f"{getattr(available, 'reason', None) or 'unsupported'}. {_platform_summary(pm, platform)}")
    logger.info("quantization: %s (%s)", name, "from the checkpoint" if ckpt else "quantized while loading")
    return quantizer
