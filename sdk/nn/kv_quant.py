"""FP8 KV cache: dtype names, the quantize/dequantize rule, per-layer scales and the start-up checks.

Why one module: the worker (cache size and allocation), the loader (checkpoint scales) and every attention
backend that reads an fp8 cache must agree on one rule, and backends are plugins (they may import ``octavo``
but not ``octavo.core``), so the rule lives in the SDK.

The rule (vLLM's): ``kv_cache_dtype="fp8"`` (= ``"fp8_e4m3"``, ``torch.float8_e4m3fn``, max 448) or
``"fp8_e5m2"`` (``torch.float8_e5m2``, max 57344). Each attention layer has a key scale and a value scale
(Python floats, fixed for the engine's life)::

    write   cache = to_fp8(clamp(x / scale, -max, max))     (round to nearest, saturating: never inf/NaN)
    read    x'    = float(cache) * scale

Scales come from the checkpoint when it has them (llm-compressor / vLLM FP8 checkpoints store
``<attn>.k_scale`` and ``<attn>.v_scale``; older ones one ``<attn>.kv_scale`` for both, or AutoFP8's
``k_proj.output_scale`` / ``v_proj.output_scale``); :func:`take_kv_scales` pulls them out of the weight
stream and attaches them to the model's ``Attention`` layers. Otherwise the scale is 1.0, vLLM's default
without ``calculate_kv_scales``. Decision (docs/quantization.md): 1.0 rather than a calibration on the first
prefill, because a calibrated scale would make every later request's output depend on which request came
first, and a scale computed from dummy data (the GPU profiling pass, CUDA-graph capture) would be wrong;
e4m3's range (normal values from 2^-6 to 448) holds the K/V activations of the models tested here.

Error bound of one stored value (round to nearest): ``|x' - x| <= max(REL[d] * |x|, ABS[d] * scale)``, with
``REL`` the half-ulp relative error of the normal range (e4m3 2^-4, e5m2 2^-3) and ``ABS`` half the smallest
subnormal (e4m3 2^-10, e5m2 2^-17); values beyond ``max * scale`` saturate.

A backend that reads fp8 caches defines ``supports_kv_cache_dtype(name, device) -> Availability``
(classmethod) and takes the scales from its instance attributes ``k_scale`` / ``v_scale`` (set by
:func:`set_kv_scales` after construction; a backend defaults them to 1.0). A backend without that method is
refused at start by :func:`check_kv_cache_dtype`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator

import torch

logger = logging.getLogger(__name__)

FP8_KV_DTYPES: dict[str, torch.dtype] = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
FP8_MAX: dict[torch.dtype, float] = {dt: float(torch.finfo(dt).max) for dt in set(FP8_KV_DTYPES.values())}
#: half-ulp relative error in the normal range; half the smallest subnormal (times the scale)
REL_ERROR = {torch.float8_e4m3fn: 2.0 ** -4, torch.float8_e5m2: 2.0 ** -3}
ABS_ERROR = {torch.float8_e4m3fn: 2.0 ** -10, torch.float8_e5m2: 2.0 ** -17}
_PLAIN = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_MAX


def kv_cache_torch_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache tensor dtype for a ``kv_cache_dtype`` setting (``auto``: the model dtype)."""
    if name == "auto":
        return model_dtype
    if name in FP8_KV_DTYPES:
        return FP8_KV_DTYPES[name]
    if name in _PLAIN:
        return _PLAIN[name]
    raise ValueError(f"kv_cache_dtype={name!r} is unknown; use one of auto, "
                     f"{', '.join(list(_PLAIN) + list(FP8_KV_DTYPES))}")


def quantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``to_fp8(clamp(x / scale))`` computed in float32 (saturating: out-of-range values become +-max)."""
    limit = FP8_MAX[dtype]
    return (x.float() / scale).clamp_(-limit, limit).to(dtype)


def dequantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``float(x) * scale`` in ``dtype`` (multiplied in float32, then rounded once to ``dtype``)."""
    out = x.float()
    if scale != 1.0:
        out = out.mul_(scale)
    return out.to(dtype)


def error_bound(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Per-element bound on ``|dequantize(quantize(x)) - x|`` for values inside the saturation limit."""
    return torch.maximum(REL_ERROR[dtype] * x.float().abs(), torch.tensor(ABS_ERROR[dtype] * scale))


# --- start-up checks -----------------------------------------------------------------------------------

def check_kv_cache_dtype(name: str, backend_cls, device: torch.device) -> None:
    """Refuse an fp8 ``kv_cache_dtype`` that this device or attention backend cannot run (message names both).

    The device check is a real probe (store and read back an fp8 tensor there), so a platform whose torch
    build has no fp8 storage says so; the backend check asks ``backend_cls.supports_kv_cache_dtype``.
    """
    if name not in FP8_KV_DTYPES:
        return
    dtype = FP8_KV_DTYPES[name]
    try:
        probe = torch.tensor([1.5, -3.0], device=device).to(dtype).float().cpu()
        ok = probe.tolist() == [1.5, -3.0]
    except (RuntimeError, TypeError) as exc:
        ok, why = False, str(exc).splitlines()[0]
    else:
        why = "a stored value read back wrong"
    if not ok:
        raise ValueError(f"kv_cache_dtype={name!r}: the {device.type} device cannot store {dtype} tensors "
                         f"({why}); use kv_cache_dtype=auto on this platform")
    backend = getattr(backend_cls, "name", backend_cls)
    hook = getattr(backend_cls, "supports_kv_cache_dtype", None)
    if backend_cls is None or hook is None:
        raise ValueError(f"kv_cache_dtype={name!r}: attention backend {backend!r} cannot read an fp8 KV cache; "
                         "use attention_backend=triton (GPU) or torch_sdpa, or kv_cache_dtype=auto")
    available = hook(name, device)
    if not available:
        raise ValueError(f"kv_cache_dtype={name!r}: attention backend {backend!r} cannot run it here: "
                         f"{available.reason}")


def set_kv_scales(impl, layer) -> None:
    """Give a layer's backend instance the layer's scales (checkpoint values, else 1.0)."""
    k, v = getattr(layer, "kv_scales", None) or (1.0, 1.0)
    impl.k_scale, impl.v_scale = float(k), float(v)


# --- checkpoint scales -----------------------------------------------------------------------------------

# <attn>.k_scale | <attn>.v_scale | <attn>.kv_scale, optionally under k_proj/v_proj/qkv_proj/attn (vLLM's
# spellings), and AutoFP8's <attn>.k_proj.output_scale / <attn>.v_proj.output_scale
_SCALE = re.compile(r"^(?P<attn>.+?)\.(?:(?:k_proj|v_proj|qkv_proj|attn)\.)?(?P<kind>k_scale|v_scale|kv_scale)$")
_OUTPUT_SCALE = re.compile(r"^(?P<attn>.+?)\.(?P<proj>k_proj|v_proj)\.output_scale$")


def _parse(name: str) -> tuple[str, str] | None:
    """``(attention module prefix in the checkpoint, "k" | "v" | "kv")`` for a KV-scale tensor name."""
    m = _OUTPUT_SCALE.match(name)
    if m:
        return m["attn"], m["proj"][0]
    m = _SCALE.match(name)
    if m:
        return m["attn"], {"k_scale": "k", "v_scale": "v", "kv_scale": "kv"}[m["kind"]]
    return None


def take_kv_scales(weights: Iterable[tuple[str, torch.Tensor]], model: torch.nn.Module
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass the checkpoint through, keeping its KV-cache scales out of it and on the ``Attention`` layers.

    Each scale lands on the paged ``Attention`` module under the checkpoint's attention prefix (e.g.
    ``model.layers.3.self_attn`` -> ``model.layers.3.self_attn.attn``) as ``layer.kv_scales = (k, v)``.
    Scales are used only with an fp8 ``kv_cache_dtype``. A scale matching several layers, with more than one value
    (per-head scales) or not positive is an error naming the tensor; one matching no layer here goes on to the
    model's ``load_weights``, which skips another pipeline stage's tensors and refuses anything else by name.
    """
    layers = {name: m for name, m in model.named_modules() if hasattr(m, "bind") and hasattr(m, "num_kv_heads")}
    for name, tensor in weights:
        parsed = _parse(name) if layers else None
        if parsed is None:
            yield name, tensor
            continue
        prefix, kind = parsed
        matches = [m for n, m in layers.items() if n == prefix or n.startswith(prefix + ".")]
        if not matches:  # another pipeline stage's layer (the model skips it) or a stray tensor (the model names it)
            yield name, tensor
            continue
        if len(matches) > 1:
            raise ValueError(f"checkpoint KV-cache scale {name!r} matches {len(matches)} attention layers of the "
                             f"model (expected one under {prefix!r})")
        if tensor.numel() != 1:
            raise ValueError(f"checkpoint KV-cache scale {name!r} has {tensor.numel()} values (per-head scales); "
                             "octavo's fp8 KV cache takes one key and one value scale per layer")
        value = float(tensor.float().reshape(()))
        if not value > 0:
            raise ValueError(f"checkpoint KV-cache scale {name!r} is {value}; a scale must be positive")
        layer = matches[0]
        k, v = getattr(layer, "kv_scales", None) or (1.0, 1.0)
        layer.kv_scales = (value if kind in ("k", "kv") else k, value if kind in ("v", "kv") else v)
