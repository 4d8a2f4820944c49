"""Combinations of LoRA settings with the rest of the engine that are refused (each names its setting)."""

from __future__ import annotations

from typing import Any


def check_lora_settings(settings: Any) -> None:
    """Raise ``ValueError`` for what ``enable_lora`` does not support (yet) instead of ignoring it."""
    lora, par = settings.lora, settings.parallel
    if not lora.enable_lora:
        if lora.lora_modules:
            raise ValueError("lora_modules needs enable_lora (--enable-lora).")
        return
    if lora.max_cpu_loras is not None and lora.max_cpu_loras < lora.max_loras:
        raise ValueError(f"max_cpu_loras={lora.max_cpu_loras} must be >= max_loras={lora.max_loras} (every adapter "
                         "on the device is also kept on the host).")
    if par.pipeline_parallel_size > 1:
        raise ValueError("enable_lora with pipeline_parallel_size > 1 is not implemented (tensor parallelism is: "
                         "adapter weights are sharded like their layers).")
    if lora.lora_modules:
        from octavo.lora.serving import parse_lora_modules

        parse_lora_modules(lora.lora_modules)
    if settings.model.task == "embed":
        raise ValueError("enable_lora is for generation; task='embed' with adapters is not implemented.")
