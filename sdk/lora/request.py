"""``LoRARequest``: which adapter a request runs with, spelled as vLLM spells it.

A msgspec struct, so it travels as plain data in ``EngineCoreRequest`` and the step contract's
``NewRequestData`` (the runner loads the adapter from ``lora_path`` on first use and caches it by
``lora_int_id``).
"""

from __future__ import annotations

import msgspec


class LoRARequest(msgspec.Struct, array_like=True, omit_defaults=True):
    """An adapter for one request.

    Args:
        lora_name: a name for logs and the server's model id.
        lora_int_id: a unique positive id; two requests with the same id share the loaded adapter (and may
            share prefix-cache blocks), so one id must always mean one adapter.
        lora_path: a directory holding a PEFT ``adapter_config.json`` and ``adapter_model.safetensors``.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or not 1 <= self.lora_int_id < 2**63:
            raise ValueError(f"LoRARequest.lora_int_id must be a positive integer, got {self.lora_int_id!r}")
        if not self.lora_name or not self.lora_path:
            raise ValueError("LoRARequest needs a non-empty lora_name and lora_path")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path
