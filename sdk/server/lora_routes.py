"""``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``: adapters added and removed at run time.

As in vLLM, the routes exist only when ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` (or
``OCTAVO_ALLOW_RUNTIME_LORA_UPDATING``) is true: anyone who can reach the server could otherwise make it read
any directory. They edit the same name -> ``LoRARequest`` registry that ``--lora-modules`` fills
(``OpenAIServing.loras``), so a loaded name is a model id in ``/v1/models`` and in ``model`` at once, and an
unloaded name is a 404 ``model_not_found`` for the next request (requests already running keep their adapter).

The adapter is checked here, not at its first request: files, config (rank <= ``max_lora_rank``, no option
octavo would ignore) and the weight names (LoRA A/B pairs of q/k/v/o and gate/up/down projections, rank as
the config says). Shapes against the base model are checked by the runner on first use (a per-request error).
``lora_int_id`` values are never reused, so one id always means one adapter in the runner's caches; an
unloaded adapter's memory is freed when those LRUs evict it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from octavo.errors import APIError
from octavo.lora.adapter import WEIGHTS_FILE, AdapterError, _split_key, read_adapter_config
from octavo.lora.request import LoRARequest

SWITCHES = ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "OCTAVO_ALLOW_RUNTIME_LORA_UPDATING")
# projections the runner can apply LoRA to (leaf module names; q/k/v and gate/up map onto fused layers)
SUPPORTED = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens"}


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str | None = None
    lora_int_id: int | None = None


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def runtime_updating_allowed(env: Any = None) -> bool:
    """True when either switch is set to a true value (``1``, ``true``, ``yes``, ``on``; any case); unset, empty or
    a false value (``0``, ``false``, ``no``, ``off``) is off, anything else an error naming the switch."""
    env = os.environ if env is None else env
    allowed = False
    for k in SWITCHES:
        raw = str(env.get(k, "")).strip()
        if raw and raw.lower() not in _TRUE + _FALSE:
            raise ValueError(f"{k}={raw!r}: use one of {', '.join(_TRUE)} (allow) or {', '.join(_FALSE)}")
        allowed = allowed or raw.lower() in _TRUE
    return allowed


def check_adapter(path: str, max_rank: int) -> None:
    """Everything about the adapter that can be known without the model; ``AdapterError`` naming the fault."""
    cfg = read_adapter_config(path, max_rank)  # files, JSON, LoRA type, refused options, rank
    with open(os.path.join(path, "adapter_config.json")) as f:
        targets = json.load(f).get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    bad = sorted({t.rsplit(".", 1)[-1] for t in targets} - SUPPORTED)
    if bad:
        raise AdapterError(f"LoRA adapter {path!r} targets {bad}; supported: {sorted(SUPPORTED)}.")
    from safetensors import safe_open

    try:
        with safe_open(os.path.join(path, WEIGHTS_FILE), framework="pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # header only, no tensor data
    except Exception as e:  # noqa: BLE001 - any reader failure is this adapter's fault
        raise AdapterError(f"LoRA adapter {path!r}: cannot read {WEIGHTS_FILE} ({e}).") from None
    pairs: dict[str, set[str]] = {}
    for key, shape in shapes.items():
        split = _split_key(key)
        if split is None:
            raise AdapterError(f"LoRA adapter {path!r} holds {key!r}, which is not a LoRA A/B weight.")
        module, part = split
        if part == "base":  # PEFT's copy of the base embedding: compared with the model's when first used
            continue
        if module.rsplit(".", 1)[-1] not in SUPPORTED:
            raise AdapterError(f"LoRA adapter {path!r} targets {module!r}; supported: {sorted(SUPPORTED)}.")
        rank = shape[0] if part == "A" else shape[-1]
        if len(shape) != 2 or rank != cfg.rank:
            raise AdapterError(f"LoRA adapter {path!r}: {key!r} has shape {shape}, not rank r={cfg.rank}.")
        pairs.setdefault(module, set()).add(part)
    if not pairs:
        raise AdapterError(f"LoRA adapter {path!r} holds no LoRA weights.")
    for module, parts in pairs.items():
        if parts != {"A", "B"}:
            raise AdapterError(f"LoRA adapter {path!r}: {module!r} lacks lora_{'B' if 'A' in parts else 'A'}.")


def register_lora_routes(app: FastAPI, settings: Any, serving: Any, reserved: list[str]) -> None:
    """Add the two routes when the switch is on; ``reserved``: the base model's names (never adapter names)."""
    if not runtime_updating_allowed():
        return
    loras: dict[str, LoRARequest] = serving.loras  # shared with --lora-modules, completions, chat, /v1/models
    next_id = [max((lr.lora_int_id for lr in loras.values()), default=0) + 1]

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        if not settings.lora.enable_lora:
            raise APIError(400, "Loading a LoRA adapter needs a server started with --enable-lora.",
                           param="lora_name")
        name, path = body.lora_name.strip(), body.lora_path.strip()
        if not name or not path:
            raise APIError(400, "lora_name and lora_path must be non-empty.", param="lora_name" if not name
                           else "lora_path")
        if name in loras or name in reserved:
            raise APIError(400, f"The lora adapter '{name}' has already been loaded (or names the base model).",
                           param="lora_name")
        try:
            check_adapter(path, settings.lora.max_lora_rank)
        except AdapterError as e:
            raise APIError(400, str(e), param="lora_path") from None
        loras[name] = LoRARequest(name, next_id[0], path)
        next_id[0] += 1
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        if body.lora_name is None and body.lora_int_id is None:
            raise APIError(400, "Give lora_name (or lora_int_id) of the adapter to unload.", param="lora_name")
        found = [n for n, lr in loras.items() if (body.lora_name is None or n == body.lora_name)
                 and (body.lora_int_id is None or lr.lora_int_id == body.lora_int_id)]
        if not found:
            what = repr(body.lora_name) if body.lora_name is not None else f"with lora_int_id {body.lora_int_id}"
            raise APIError(404, f"The lora adapter {what} cannot be found.",
                           param="lora_name" if body.lora_name is not None else "lora_int_id", code="not_found")
        del loras[found[0]]
        serving.unloaded_loras.add(found[0])  # a request already past its model check gets a 404 too
        return PlainTextResponse(f"Success: LoRA adapter '{found[0]}' removed successfully.")
