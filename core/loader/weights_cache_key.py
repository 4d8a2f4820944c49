"""The key of the processed-weights cache (core/loader/weights_cache.py): what a cached file depends on.

SHA-256 over: the GGUF file's bytes (hashed on a thread that ``prefetch_digest`` starts before the engine core
imports torch; hashlib and file reads drop the GIL), octavo's version and the path, size and mtime of every
source file that shapes the loaded tensors (sdk, core/loader, plugins/quant, plugins/models: an edited repack
function is a new key), torch's version, the CPU's feature flags, the
model class, dtype, device, the quantizer's class and state, the model config and every ``OCTAVO_*`` environment
variable but the few that cannot change a tensor. This module imports neither torch nor transformers at import.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from typing import Any

logger = logging.getLogger("octavo.core.loader.weights_cache")

FORMAT = 1
# OCTAVO_* variables that cannot change the loaded tensors (left out of the key so the benchmark's own hit)
_ENV_IGNORED = {"OCTAVO_CACHE_DIR", "OCTAVO_DISABLE_PROGRESS", "OCTAVO_WEIGHTS_CACHE", "OCTAVO_CPU_ADAPTIVE_THREADS"}
_SIMPLE = (str, int, float, bool, type(None))

_digests: dict[str, tuple[threading.Thread | None, list]] = {}


class CacheMiss(Exception):
    """The cache file is missing, stale or damaged (the message says which); the model loads normally."""


def enabled() -> bool:
    from octavo.env_flags import env_switch

    return env_switch("OCTAVO_WEIGHTS_CACHE", True)


# ------------------------------------------------------------------------------------------ the key

def _hash_file(path: str, out: list) -> None:
    from octavo.core.loader.file_digest import file_sha256  # remembered by the file identity

    try:  # hashlib and read() drop the GIL: this runs beside the torch import
        out.append(file_sha256(path))
    except OSError as e:
        out.append(e)


def prefetch_digest(path: str | None) -> None:
    """Start hashing ``path`` on a daemon thread (the engine core calls this before importing torch)."""
    if not path or path in _digests or not enabled() or not os.path.isfile(path):
        return
    out: list = []
    thread = threading.Thread(target=_hash_file, args=(path, out), name="octavo-gguf-digest", daemon=True)
    thread.start()
    _digests[path] = (thread, out)


def prefetch_for_model(model: str | None) -> None:
    """``prefetch_digest`` of the GGUF file a ``model`` setting names (None: the embedded model); other models
    (directories, hub ids) are left alone."""
    try:
        if model is None:
            from octavo.core.loader.resolve import default_model_path

            model = default_model_path()
        if model.endswith(".gguf"):
            prefetch_digest(os.path.abspath(model))
    except (ValueError, OSError):  # the load reports a missing model with its own message
        pass


def file_digest(path: str) -> str:
    """SHA-256 of the file's bytes (the prefetched result when there is one)."""
    path = os.path.abspath(path)
    if path not in _digests:
        out: list = []
        _hash_file(path, out)
        _digests[path] = (None, out)
    thread, out = _digests[path]
    if thread is not None:
        thread.join()
    if isinstance(out[0], BaseException):
        raise CacheMiss(f"cannot read {path}: {out[0]}")
    return out[0]


def _code_fingerprint() -> str:
    """Path, size and mtime of every source file that can shape the loaded tensors: octavo's sdk (nn layers,
    quantization scope, ...), core/loader, plugins/quant and plugins/models. An edit there changes the key; edits
    elsewhere (the server, the scheduler, attention kernels) do not, so a shared tree keeps its cache."""
    import octavo
    import octavo.plugins
    from octavo.version import __version__

    h = hashlib.sha256(f"octavo {__version__}".encode())
    sdk = os.path.dirname(os.path.abspath(octavo.__file__))
    plugins = os.path.dirname(os.path.abspath(octavo.plugins.__file__))
    roots = [(sdk, {"core", "plugins", "server", "cli", "testing", "chat_templates", "static"}),
             (os.path.dirname(os.path.abspath(__file__)), set()),  # core/loader (this folder)
             (os.path.join(plugins, "quant"), set()), (os.path.join(plugins, "models"), set())]
    for root, skip in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not (folder == root and d in skip))
            for name in sorted(files):
                if name.endswith((".py", ".c", ".cpp", ".h", ".json")):
                    st = os.stat(os.path.join(folder, name))
                    h.update(f"{os.path.relpath(os.path.join(folder, name), root)}|{st.st_size}|{st.st_mtime_ns}\n"
                             .encode())
    return h.hexdigest()


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _plain(value: Any) -> Any:
    """``value`` as JSON-able data, or raise ``TypeError`` (an object whose state the key cannot see)."""
    if isinstance(value, _SIMPLE):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    raise TypeError(type(value).__name__)


def ineligible_reason(resolved: Any, device: Any, quantizer: Any = None) -> str | None:
    """Why this load is not cached (None: it is)."""
    from octavo.nn.parallel import expert_parallel_enabled, get_tp_size
    from octavo.nn.pipeline import get_pp_size

    if not enabled():
        return "OCTAVO_WEIGHTS_CACHE=0"
    if resolved.format != "gguf" or not getattr(resolved, "gguf_path", None):
        return f"format {resolved.format} (only GGUF files are cached)"
    if quantizer is None:  # dequantized weights: a cache file 4-8x the GGUF, for a plain copy at load
        return "no quantizer (only quantized GGUF weights are cached)"
    if str(device) != "cpu":
        return f"device {device}"
    if get_tp_size() != 1 or get_pp_size() != 1 or expert_parallel_enabled():
        return "tensor/pipeline/expert parallel"
    return None


def cache_key(resolved: Any, model_cls: Any, dtype: Any, device: Any, quantizer: Any) -> str:
    """The cache key of one load (see the module docstring); raises ``CacheMiss`` if it cannot be formed."""
    import torch

    try:
        quant = None if quantizer is None else [type(quantizer).__module__, type(quantizer).__qualname__,
                                                 _plain(dict(vars(quantizer)))]
        config = json.dumps(resolved.hf_config.to_dict(), sort_keys=True, default=str)
    except (TypeError, AttributeError) as e:
        raise CacheMiss(f"the quantizer's or config's state is not plain data ({e})") from None
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("OCTAVO_") and k not in _ENV_IGNORED)
    parts = [FORMAT, file_digest(resolved.gguf_path), _code_fingerprint(), torch.__version__, _cpu_flags(),
             f"{model_cls.__module__}.{model_cls.__qualname__}", str(dtype), str(device), quant, config, env,
             torch.get_default_dtype().__repr__()]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def cache_path(key: str) -> str:
    from octavo.core.loader.tokenizer import cache_root

    return os.path.join(cache_root(), "weights", f"{key}.bin")


def key_for(resolved: Any, model_cls: Any, dtype: Any, device: Any, quantizer: Any) -> str | None:
    """The cache key of this load, or None when it is not cached (why: logged at debug level)."""
    reason = ineligible_reason(resolved, device, quantizer)
    if reason is None:
        try:
            return cache_key(resolved, model_cls, dtype, device, quantizer)
        except CacheMiss as e:
            reason = str(e)
    logger.debug("weights cache: not used (%s)", reason)
    return None
