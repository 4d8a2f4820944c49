"""``octavo serve --enable-lora --lora-modules name=path ...``: adapters as model ids of the OpenAI server.

Each ``name=path`` becomes a :class:`LoRARequest` (ids 1, 2, ... in the order given); the server lists the
names in ``/v1/models`` (``parent``: the base model) and a request whose ``model`` is one of them runs with
that adapter. Adapters are checked at start, so a bad path fails ``octavo serve``, not the first request.
"""

from __future__ import annotations

from typing import Any

from octavo.lora.adapter import AdapterError, read_adapter_config
from octavo.lora.request import LoRARequest


def parse_lora_modules(modules: list[str]) -> list[tuple[str, str]]:
    """``["name=path", ...]`` -> ``[(name, path)]``; raises ``ValueError`` naming the bad entry."""
    pairs = []
    for item in modules:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"lora_modules entry {item!r} must be name=path (a JSON form is not implemented).")
        pairs.append((name.strip(), path.strip()))
    names = [n for n, _ in pairs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"lora_modules names must be unique; repeated: {sorted(dup)}")
    return pairs


def served_loras(settings: Any) -> dict[str, LoRARequest]:
    """The adapters named by ``lora_modules``, checked (files, config, rank); empty without them."""
    modules = settings.lora.lora_modules or []
    out = {}
    for i, (name, path) in enumerate(parse_lora_modules(modules), 1):
        try:
            read_adapter_config(path, settings.lora.max_lora_rank)
        except AdapterError as e:
            raise ValueError(f"--lora-modules {name}={path}: {e}") from None
        out[name] = LoRARequest(name, i, path)
    return out
