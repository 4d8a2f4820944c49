"""Sleep mode (vLLM's ``LLM.sleep`` / ``wake_up``): give the memory of an idle engine back, then resume.

    level 1   weights -> host memory (a no-op on a CPU: they are host memory already), KV cache freed
    level 2   weights and KV cache freed; ``wake_up`` reloads the weights from the checkpoint
    wake_up   tags ``weights`` and/or ``kv_cache`` (default both): weights back on the device, a fresh (zeroed)
              KV cache bound to the attention layers; the core's prefix cache was reset when it slept

Worker side: :func:`sleep_worker`, :func:`wake_worker`, :func:`reload_weights` (called through
``collective_rpc``, so every rank of every executor does the same). Engine side: :class:`SleepControl`
refuses sleeping with requests in flight and refuses new requests while asleep, each with an error naming
the fix. What each call freed is returned (bytes per kind) and logged.

NOTE: a platform that captured device graphs (CUDA graphs) holds the old weight and KV addresses, so sleep
is refused there unless ``enforce_eager=True`` (vLLM keeps the addresses with its own allocator; octavo has none).
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

_TAGS = ("weights", "kv_cache")


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter by name, each storage once (tied weights share one). Buffers (rotary tables) stay:
    they are small, and layers may share one cached table between model instances."""
    seen, out = set(), {}
    for name, t in model.named_parameters(remove_duplicate=False):
        key = (t.untyped_storage().data_ptr(), t.data_ptr(), tuple(t.shape))
        if t.numel() == 0 or key in seen:
            continue
        seen.add(key)
        out[name] = t
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _empty_like_meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=t.dtype, device=t.device)


def sleep_worker(worker: Any, level: int = 1) -> dict[str, int]:
    """Free this worker's KV cache and offload (level 1) or discard (level 2) its weights."""
    if level not in (1, 2):
        raise ValueError(f"sleep level must be 1 or 2, got {level!r}.")
    if getattr(worker, "_sleep", None) is not None:
        raise ValueError("the worker is already asleep; call wake_up() first.")
    graph_runner = getattr(worker.runner, "graph_runner", None)
    if graph_runner is not None and getattr(graph_runner, "holds_addresses", True):
        raise ValueError("sleep mode: this platform captured device graphs that hold the weights' and KV cache's "
                         "addresses; start the engine with enforce_eager=True to use sleep mode.")
    state: dict[str, Any] = {"level": level, "kv": False, "weights": {}}
    freed = {"kv_cache_bytes": sum(_nbytes(kv) for kv in worker.kv_caches), "weights_offloaded_bytes": 0,
             "weights_discarded_bytes": 0}
    for layer in worker.attn_layers:
        layer.kv_cache = None
    worker.kv_caches = []
    state["kv"] = True
    on_host = worker.device.type == "cpu"
    for name, t in _tensors(worker.model).items():
        if level == 1 and on_host:
            continue  # already host memory: nothing to move
        state["weights"][name] = (t, t.data.to("cpu") if level == 1 else None, tuple(t.shape))
        freed["weights_offloaded_bytes" if level == 1 else "weights_discarded_bytes"] += _nbytes(t)
        t.data = _empty_like_meta(t)
    worker._sleep = state
    _give_back(worker)
    logger.info("sleep level %d: freed KV cache %.1f MiB, weights offloaded %.1f MiB, discarded %.1f MiB", level,
                freed["kv_cache_bytes"] / 2**20, freed["weights_offloaded_bytes"] / 2**20,
                freed["weights_discarded_bytes"] / 2**20)
    return freed


def wake_worker(worker: Any, tags: list[str] | None = None) -> list[str]:
    """Restore ``tags`` (default: weights and KV cache); returns what is still asleep."""
    state = getattr(worker, "_sleep", None)
    if state is None:
        return []
    tags = list(tags) if tags else list(_TAGS)
    bad = [t for t in tags if t not in _TAGS]
    if bad:
        raise ValueError(f"wake_up tags must be among {list(_TAGS)}, got {bad}.")
    if "weights" in tags and state["weights"]:
        if state["level"] == 1:
            for t, host, _ in state["weights"].values():
                t.data = host.to(worker.device)
        else:
            reload_weights(worker)
        state["weights"] = {}
    if "kv_cache" in tags and state["kv"]:
        worker._allocate_kv_cache()
        state["kv"] = False
    left = [name for name, on in (("weights", bool(state["weights"])), ("kv_cache", state["kv"])) if on]
    if not left:
        worker._sleep = None
    return left


def _give_back(worker: Any) -> None:
    """Return freed memory to the system: the device's caching allocator, or glibc's heap on a CPU (tensors of
    a few MiB live in malloc arenas, which keep freed pages until trimmed)."""
    gc.collect()
    if hasattr(worker.platform, "empty_cache"):
        worker.platform.empty_cache()
    if worker.device.type == "cpu":
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: the allocator keeps the pages for reuse
            pass


def reload_weights(worker: Any) -> int:
    """Load the checkpoint again (quantized exactly as at start) into this worker's model, in place.

    The model object, its hooks (LoRA, speculator heads) and the tensors' names stay; only their data is
    replaced. Returns the number of tensors loaded.
    """
    from octavo.core.loader import load_model
    from octavo.core.loader.quant import resolve_quantizer
    from octavo.core.plugin_manager import get_plugin_manager

    pm = get_plugin_manager()
    quantizer = resolve_quantizer(worker.settings.model.quantization, worker.resolved, worker.platform, pm)
    fresh = load_model(worker.resolved, model_cls=type(worker.model), dtype=worker.dtype, device=worker.device,
                       quantizer=quantizer)
    new = dict(fresh.named_parameters(remove_duplicate=False))
    state = getattr(worker, "_sleep", None) or {"weights": {}}
    targets = {name: entry[0] for name, entry in state["weights"].items()} or _tensors(worker.model)
    missing = [name for name in targets if name not in new]
    if missing:
        raise RuntimeError(f"reload_weights: the checkpoint no longer provides {missing[:5]}; the model keeps "
                           "its current weights.")
    for name, t in targets.items():
        t.data = new[name].data
    del fresh, new
    _give_back(worker)
    return len(targets)


class SleepControl:
    """The engine core's side: when sleeping is allowed, what it does to the prefix cache, and the gate on
    new requests while asleep."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.level = 0

    def check_enabled(self) -> None:
        if not self.core.settings.model.enable_sleep_mode:
            raise ValueError("sleep mode is off; start the engine with enable_sleep_mode=True "
                             "(--enable-sleep-mode).")

    def sleep(self, level: int = 1) -> dict[str, int]:
        self.check_enabled()
        core = self.core
        if core.has_unfinished_requests():
            raise ValueError("sleep: requests are still running or waiting; wait for them (or abort them) first.")
        if core.settings.scheduler.speculative_config:
            raise ValueError("sleep mode is not supported with speculative_config (the draft model keeps its "
                             "memory); start without it to use sleep mode.")
        results = core.executor.collective_rpc("sleep", args=[level])
        core.kv.reset_prefix_cache() if hasattr(core.kv, "reset_prefix_cache") else core.kv.pool.reset_prefix_cache()
        self.level = level
        return {k: sum(r[k] for r in results) for k in results[0]}

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.check_enabled()
        left = self.core.executor.collective_rpc("wake_up", args=[list(tags) if tags else None])
        if not left[0]:
            self.level = 0

    def is_sleeping(self) -> bool:
        return self.level > 0

    def check_awake(self) -> None:
        if self.level:
            raise ValueError(f"the engine is asleep (level {self.level}); call wake_up() before sending requests.")
