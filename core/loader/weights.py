"""Building a model and streaming its weights in: safetensors (sharded or not), ``.bin`` / ``.pt``, GGUF, dummy.

The model is built under the target dtype and device, so its parameters are allocated once, where they
will live. Checkpoint tensors then stream one at a time (shard by shard, memory-mapped) through
``model.load_weights``, whose per-parameter loaders copy (and convert) each into place: at no point is
there a second full copy of the weights. A tqdm bar counts tensors.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from glob import glob

import torch
from tqdm.auto import tqdm

from octavo.core.loader.resolve import ResolvedModel
from octavo.env_flags import env_switch

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "half": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str, hf_config=None, platform_default: str = "float32",
                  supported: list[str] | None = None) -> torch.dtype:
    """The compute dtype for a ``dtype`` setting.

    ``auto`` is the platform's default, except that a bfloat16 checkpoint is not squeezed into float16 (its
    range would overflow): it stays bfloat16 if the platform supports it. An explicit dtype the platform does
    not support is an error naming the ones it does.
    """
    if dtype != "auto":
        result = DTYPES[dtype]
    else:
        result = DTYPES[platform_default]
        checkpoint = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
        if result == torch.float16 and checkpoint in (torch.bfloat16, "bfloat16") and \
                (supported is None or "bfloat16" in supported):
            result = torch.bfloat16
    name = str(result).removeprefix("torch.")
    if supported is not None and name not in supported:
        raise ValueError(f"dtype={dtype} ({name}) is not supported on this platform; use one of {supported}")
    return result


def _safetensors_files(directory: str) -> list[str]:
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        missing = [f for f in files if not os.path.isfile(os.path.join(directory, f))]
        if missing:
            raise ValueError(f"{index} lists shards that are missing: {missing}")
        return [os.path.join(directory, f) for f in files]
    return sorted(glob(os.path.join(directory, "*.safetensors")))


def _pt_files(directory: str) -> list[str]:
    index = os.path.join(directory, "pytorch_model.bin.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            return [os.path.join(directory, x) for x in sorted(set(json.load(f)["weight_map"].values()))]
    return sorted(glob(os.path.join(directory, "*.bin")) + glob(os.path.join(directory, "*.pt")))


def iter_weights(resolved: ResolvedModel, desc: str = "Loading weights",
                 keep_gguf_blocks=None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(checkpoint name, CPU tensor)`` pairs of a checkpoint, one at a time, with a progress bar.

    ``keep_gguf_blocks(name) -> bool`` keeps those GGUF tensors as raw blocks (see ``iter_gguf_weights``).
    """
    disable = env_switch("OCTAVO_DISABLE_PROGRESS", False)  # 1/0 only: "true" was silently read as 0
    if resolved.format == "safetensors":
        from octavo.core.loader.safetensors_mmap import iter_safetensors, num_tensors

        files = _safetensors_files(resolved.path)  # zero-copy views of the mapped shards, kernel read-ahead
        yield from tqdm(iter_safetensors(files), total=num_tensors(files), desc=desc, unit="tensor",
                        disable=disable)
    elif resolved.format == "pt":
        files = _pt_files(resolved.path)
        for path in tqdm(files, desc=desc, unit="shard", disable=disable):
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            yield from state.items()
            del state
    elif resolved.format == "gguf":
        from octavo.core.loader.gguf_file import gguf_num_weights, iter_gguf_weights

        path = resolved.gguf_path
        yield from tqdm(iter_gguf_weights(path, resolved.hf_config, keep_gguf_blocks), total=gguf_num_weights(path), desc=desc,
                        unit="tensor", disable=disable)
    else:
        raise ValueError(f"format {resolved.format!r} has no weights to iterate")


def _init_dummy(model: torch.nn.Module, seed: int, skip: tuple[str, ...] = ()) -> None:
    """Small random weights (uniform in [-1e-3, 1e-3], norms at 1): shapes and speed are real, outputs are not.

    Drawn on the parameter's own device with a generator of that device: drawing 8B numbers on the host took
    most of the start time of an 8B-shape model on a GPU (docs/performance.md, "GPU after the refactors").
    """
    gens: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if not param.is_floating_point() or name.startswith(skip):  # skip: quantized layers, filled apart
            continue
        if "norm" in name:  # a zero-mean norm weight would silence the whole layer
            param.data.fill_(1.0)
            continue
        gen = gens.get(param.device)
        if gen is None:
            gen = gens[param.device] = torch.Generator(device=param.device).manual_seed(seed)
        values = torch.empty(param.shape, dtype=torch.float32, device=param.device).uniform_(-1e-3, 1e-3,
                                                                                            generator=gen)
        param.data.copy_(values)


def load_model(resolved: ResolvedModel, *, model_cls, dtype: torch.dtype, device: torch.device | str,
               quantizer=None, seed: int = 0) -> torch.nn.Module:
    """Build ``model_cls`` for ``resolved`` under ``dtype`` on ``device`` and load its weights.

    Args:
        resolved: from :func:`resolve_model`.
        model_cls: the registered model class (``model_cls(config=..., prefix="")``).
        dtype: parameter dtype; checkpoint tensors are converted as they are copied in.
        device: where the parameters are allocated.
        quantizer: an optional ``octavo.Quantizer`` (from ``resolve_quantizer``): the model is built inside
            its ``quantization_scope``, so each linear layer takes its method by prefix, and the checkpoint
            streams through ``quantizer.adapt_weights``.
        seed: seed of the random weights for ``format == "dummy"``.

    Raises:
        ValueError: the checkpoint lacks weights the model needs, or holds tensors it cannot place.
    """
    device = torch.device(device)
    from octavo.nn.kv_quant import take_kv_scales
    from octavo.quant import quantization_scope

    if quantizer is not None and getattr(model_cls, "supports_quantization", True) is False:
        raise ValueError(f"{resolved.architecture} has no quantized variant in octavo; drop the quantization "
                         f"setting ({quantizer.name!r})")
    import octavo.core.loader.weights_cache as weights_cache  # processed GGUF weights mmap-loaded from disk (issue 18)

    cache_key = weights_cache.key_for(resolved, model_cls, dtype, device, quantizer)
    pending = weights_cache.PendingRead(cache_key) if cache_key is not None else None  # checked while we build
    old_dtype = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device), quantization_scope(
                quantizer, getattr(model_cls, "packed_modules_mapping", None)) as methods:
            model = model_cls(config=resolved.hf_config, prefix="")
    finally:
        torch.set_default_dtype(old_dtype)
    if quantizer is not None and not methods:
        raise ValueError(f"quantization {quantizer.name!r}: {resolved.architecture} has no linear layer it applies "
                         "to (the model does not build its projections from octavo.nn linear layers)")
    if cache_key is not None:
        if weights_cache.try_restore(model, cache_key, resolved.source, pending):
            return model.eval()
        before = weights_cache.snapshot(model)
    if resolved.format == "dummy":
        _init_dummy(model, seed, skip=tuple(f"{prefix}." for prefix in methods))
        if quantizer is not None:
            _init_dummy_quantized(model, methods, seed)
    else:
        weights = iter_weights(resolved, keep_gguf_blocks=_gguf_block_filter(quantizer, methods))
        weights = take_kv_scales(weights, model)  # k_scale/v_scale onto the Attention layers (nn/kv_quant.py)
        if quantizer is not None:
            weights = quantizer.adapt_weights(weights, methods)
        loaded = model.load_weights(weights)
        expected = {name for name, _ in model.named_parameters(remove_duplicate=False)}
        missing = sorted(expected - set(loaded))
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise ValueError(f"checkpoint {resolved.source} lacks weights for {shown}; is it complete and is "
                             f"its config.json the right one?")
    for module in model.modules():
        hook = getattr(module, "process_weights_after_loading", None)
        if callable(hook):
            hook()
    if cache_key is not None:
        weights_cache.save(model, cache_key, before)
    return model.eval()


def _init_dummy_quantized(model: torch.nn.Module, methods: dict, seed: int) -> None:
    """Random dense weights for each quantized layer, quantized by its method (benchmarks of online methods).

    Only methods that quantize a dense ``weight`` can do this; a checkpoint format (GPTQ, GGUF) cannot.
    """
    layers = dict(model.named_modules())
    gens: dict[torch.device, torch.Generator] = {}
    for prefix, method in methods.items():
        if tuple(method.checkpoint_suffixes) != ("weight",):
            raise ValueError(f"load_format='dummy' cannot make random {type(method).__name__} weights (it reads "
                             f"{method.checkpoint_suffixes}); use a quantization that quantizes dense weights")
        layer = layers[prefix]
        device = next(layer.parameters()).device
        gen = gens.setdefault(device, torch.Generator(device=device).manual_seed(seed))
        dense = torch.empty(layer.output_size, layer.input_size, device=device).uniform_(-1e-3, 1e-3, generator=gen)
        for suffix, value in method.convert({"weight": dense}, prefix).items():
            getattr(layer, suffix).data.copy_(value)


def _gguf_block_filter(quantizer, methods):
    """``name -> bool`` for the GGUF tensors a block-reading quantizer repacks itself (None: dequantize all)."""
    if quantizer is None or not getattr(quantizer, "reads_gguf_blocks", False):
        return None
    modules = {part for prefix in methods for part in quantizer.part_prefixes(prefix)}
    return lambda name: name.endswith(".weight") and name.removesuffix(".weight") in modules


def get_max_model_len(hf_config, requested: int | None = None) -> int:
    """The context length: ``requested`` if given (and not beyond the model's), else the model's own.

    The model's own is ``max_position_embeddings`` (or ``n_positions`` / ``max_seq_len`` / ``seq_length``).
    """
    derived = None
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length"):
        value = getattr(hf_config, key, None)
        if isinstance(value, int) and value > 0:
            derived = value
            break
    if derived is None:
        derived = 2048
        logger.warning("config states no context length; assuming %d", derived)
    if requested is None:
        return derived
    if requested > derived:
        raise ValueError(f"max_model_len={requested} exceeds the model's context length {derived} "
                         f"(max_position_embeddings); use max_model_len <= {derived}")
    return requested
