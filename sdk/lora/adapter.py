"""Reading and checking PEFT LoRA adapters (``adapter_config.json`` + ``adapter_model.safetensors``).

Two checks, at two places, so that a bad adapter fails only the request that names it:

- :func:`check_lora_request` (front end, before the request is queued): files present, a LoRA config,
  rank <= ``max_lora_rank``, no option octavo would otherwise ignore (DoRA, biases, ``modules_to_save``, ...).
- :func:`load_adapter` (runner, on first use): tensor names map onto the model's projections (q/k/v ->
  ``qkv_proj``, gate/up -> ``gate_up_proj`` through ``packed_modules_mapping``) and every shape matches.

``lora_alpha / r`` (or ``lora_alpha / sqrt(r)`` with ``use_rslora``) is folded into B once, at load.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from octavo.errors import InputError
from octavo.lora.request import LoRARequest

if TYPE_CHECKING:  # annotations only: the server's front end builds its routes from here without torch
    import torch

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
# adapter options that change the math; any non-default value is refused rather than ignored
_REFUSED = {"use_dora": False, "fan_in_fan_out": False, "bias": "none", "lora_bias": False,
            "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}, "layer_replication": None,
            "trainable_token_indices": None}


class AdapterError(ValueError):
    """A LoRA adapter that cannot be served (missing files, unsupported options, wrong shapes)."""


@dataclass
class AdapterConfig:
    rank: int
    scaling: float


def read_adapter_config(path: str, max_rank: int) -> AdapterConfig:
    """The adapter's rank and scaling; raises :class:`AdapterError` naming what is wrong."""
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not os.path.isfile(os.path.join(path, name)):
            raise AdapterError(f"LoRA adapter {path!r} has no {name} (a PEFT adapter directory holds "
                               f"{CONFIG_FILE} and {WEIGHTS_FILE}).")
    try:
        with open(os.path.join(path, CONFIG_FILE)) as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise AdapterError(f"LoRA adapter {path!r}: {CONFIG_FILE} is not valid JSON ({e}).") from None
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"LoRA adapter {path!r} is a {cfg.get('peft_type')} adapter; only LORA is supported.")
    for key, default in _REFUSED.items():
        value = cfg.get(key, default)
        if value not in (default, None) and value != {} and value != []:
            raise AdapterError(f"LoRA adapter {path!r} sets {key}={value!r}, which octavo does not implement.")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if not isinstance(r, int) or r < 1:
        raise AdapterError(f"LoRA adapter {path!r}: r={r!r} is not a positive integer.")
    if r > max_rank:
        raise AdapterError(f"LoRA adapter {path!r} has rank {r} > max_lora_rank={max_rank}; raise --max-lora-rank.")
    scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    return AdapterConfig(r, float(scaling))


def check_lora_request(lora: Any, settings: Any, pooling: bool = False) -> LoRARequest:
    """Front-end check of a request's adapter; an ``InputError`` on field ``lora_request`` otherwise."""
    if not isinstance(lora, LoRARequest):
        raise InputError(f"lora_request must be an octavo.lora.request.LoRARequest, got {type(lora).__name__}.",
                         "lora_request")
    if not settings.lora.enable_lora:
        raise InputError(f"request names LoRA adapter {lora.lora_name!r} but this engine runs without "
                         "enable_lora (--enable-lora).", "lora_request")
    if pooling:
        raise InputError("LoRA adapters are for generation; embeddings with an adapter are not implemented.",
                         "lora_request")
    try:
        read_adapter_config(lora.lora_path, settings.lora.max_lora_rank)
    except AdapterError as e:
        raise InputError(str(e), "lora_request") from None
    return lora


def _split_key(key: str) -> tuple[str, str] | None:
    """``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` -> (module path, "A").

    PEFT's embedding LoRA is ``<module>.lora_embedding_A`` ``[r, vocab]`` / ``lora_embedding_B`` ``[hidden, r]``
    (the same shapes as a linear's A ``[r, in]`` / B ``[out, r]``, so "A"/"B" too); ``<module>.base_layer.weight``
    (PEFT saves the base embedding next to an embedding LoRA) gives "base".
    """
    for marker, part in ((".lora_A.", "A"), (".lora_B.", "B")):
        if marker in key:
            return key.split(marker)[0].removeprefix("base_model.model."), part
    for suffix, part in ((".lora_embedding_A", "A"), (".lora_embedding_B", "B"), (".base_layer.weight", "base")):
        if key.endswith(suffix):
            return key[: -len(suffix)].removeprefix("base_model.model."), part
    return None


def load_adapter(path: str, max_rank: int, targets: dict[str, tuple[str, int, int, int]],
                 base_weights: dict[str, torch.Tensor] | None = None
                 ) -> tuple[AdapterConfig, dict[str, list[tuple[int, torch.Tensor, torch.Tensor]]]]:
    """Load an adapter onto the host and check it against the model.

    Args:
        targets: checkpoint module path (``model.layers.0.self_attn.q_proj``) -> (octavo module path,
            shard index, shard output size, input size), built by the manager from the model.
        base_weights: checkpoint module path -> (the model's weight rows on this rank, full shape, first row),
            for modules whose base weight PEFT saves
            in the adapter (``embed_tokens``): the saved copy must match it (a resized or retrained embedding
            table is refused, not silently replaced by the base one).

    Returns:
        the config and ``{octavo module: [(shard, A [r, in], B [out_shard, r] * scaling)]}`` in float32.
    """
    from safetensors.torch import load_file

    cfg = read_adapter_config(path, max_rank)
    try:
        tensors = load_file(os.path.join(path, WEIGHTS_FILE))
    except Exception as e:  # noqa: BLE001 - any reader failure is this adapter's fault
        raise AdapterError(f"LoRA adapter {path!r}: cannot read {WEIGHTS_FILE} ({e}).") from None
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        split = _split_key(key)
        if split is None:
            raise AdapterError(f"LoRA adapter {path!r} holds {key!r}, which is not a LoRA A/B weight "
                               "(modules_to_save is not implemented).")
        if split[1] == "base":
            _check_base_copy(path, split[0], t, (base_weights or {}).get(split[0]))
            continue
        pairs.setdefault(split[0], {})[split[1]] = t
    out: dict[str, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
    for module, ab in pairs.items():
        if module not in targets:
            raise AdapterError(f"LoRA adapter {path!r} targets {module!r}, which has no LoRA-capable projection "
                               "in this model (supported: q/k/v/o_proj, gate/up/down_proj and embed_tokens; "
                               "lm_head adapters are not implemented).")
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"LoRA adapter {path!r}: {module!r} lacks lora_{'B' if 'A' in ab else 'A'}.")
        fused, shard, out_size, in_size = targets[module]
        a, b = ab["A"].float(), ab["B"].float()
        if a.shape != (cfg.rank, in_size) or b.shape != (out_size, cfg.rank):
            raise AdapterError(f"LoRA adapter {path!r}: {module!r} has A {tuple(a.shape)} and B {tuple(b.shape)}, "
                               f"but this base model needs A ({cfg.rank}, {in_size}) and B ({out_size}, "
                               f"{cfg.rank}); was it trained on another model?")
        out.setdefault(fused, []).append((shard, a, b * cfg.scaling))
    if not out:
        raise AdapterError(f"LoRA adapter {path!r} holds no LoRA weights.")
    return cfg, out


def _check_base_copy(path: str, module: str, saved: torch.Tensor, base: tuple | None) -> None:
    """PEFT's saved copy of a base weight must be the model's own (up to the model's dtype / quantization).

    ``base``: (this rank's rows of the model's table, the full table's shape, the first row's index).
    """
    if base is None:
        raise AdapterError(f"LoRA adapter {path!r} holds a base weight for {module!r} (modules_to_save-like), "
                           "which octavo does not implement.")
    weight, full_shape, row0 = base
    if tuple(saved.shape) != tuple(full_shape):
        raise AdapterError(f"LoRA adapter {path!r}: {module!r} was trained with a table of shape "
                           f"{tuple(saved.shape)}, this model's is {tuple(full_shape)} (resized vocabularies are "
                           "not implemented).")
    w = weight.detach().float().cpu()
    if w.numel() and (saved[row0:row0 + w.shape[0]].float() - w).abs().max() > 0.02 * float(w.abs().max()):
        raise AdapterError(f"LoRA adapter {path!r}: its saved {module!r} weight differs from this model's "
                           "(trained on another base, or a retrained table: not implemented).")
