"""What the engine says once it is built: one log line naming every choice that decides speed and output
(platform, attention backend, dtype, quantization, KV cache size), and the same facts to
``octavo_on_engine_start`` plugins. Choices made silently are the hardest to debug (an always-available
third-party platform quietly winning selection, a backend fallback), so none is left out.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from octavo.start_timing import process_age_s

logger = logging.getLogger("octavo.engine")

_phases: list[tuple[str, float]] = []  # (name, seconds) of this process's engine start, in order
_last_mark: list[float] = []


def begin_engine_start() -> None:
    """An engine starts being built in this process: forget the phases of an earlier one. The first engine of a
    process also records the time before it (interpreter start, imports; for ``LLM`` in a script, the script's own
    work before ``LLM(...)`` too)."""
    first = not _last_mark
    _phases.clear()
    _last_mark[:] = [time.perf_counter()]
    age = process_age_s() if first else None
    if age is not None and _imports_done:  # a pre-started core (core/engine_prestart.py): split its wait off
        done = min(_imports_done[0], age)
        _phases.append(("process start to engine start (imports)", done))
        _phases.append(("waiting for the front end's settings", age - done))
    elif age is not None:
        _phases.append(("process start to engine start (imports)", age))


_imports_done: list[float] = []  # process age when a pre-started core had its imports done


def note_imports_done() -> None:
    """A pre-started core finished its imports and now waits for the front end's settings: the start log
    shows the two apart (which side the start waits on)."""
    age = process_age_s()
    if age is not None:
        _imports_done[:] = [age]


def start_phase(name: str) -> None:
    """Record that the start phase ``name`` just ended: it took the time since the previous mark.
    ``announce_engine_start`` logs them all (issue 17: ``octavo serve`` logs where its start time went)."""
    now = time.perf_counter()
    if not _last_mark:  # a worker process (mp executor): no engine here; count from its own start
        age = process_age_s()
        _phases.append((name, age if age is not None else 0.0))
    else:
        _phases.append((name, now - _last_mark[0]))
    _last_mark[:] = [now]


def start_phases() -> list[tuple[str, float]]:
    """The recorded ``(phase, seconds)`` of this process, in order."""
    return list(_phases)


def announce_engine_start(pm: Any, settings: Any, platform: Any, info: Any) -> None:
    """Log the engine's choices and call ``octavo_on_engine_start`` with them.

    Args:
        pm: the plugin manager.
        settings: the engine's settings.
        platform: the selected :class:`octavo.Platform` instance.
        info: the executor's ``WorkerInfo`` (dtype, attention backend, quantization, cache geometry).
    """
    # NOTE: WorkerInfo.quantization is read with getattr so an executor built before the field existed still
    # starts; tests/plugins/test_builtin_copy.py checks that the real value ("gguf" for SmolLM2) arrives.
    quantization = getattr(info, "quantization", None)
    facts = dict(platform=platform.name, attention_backend=info.attention_backend, dtype=info.dtype,
                 quantization=quantization, num_kv_blocks=info.num_blocks, block_size=info.block_size)
    logger.info("engine start: platform %s (%s), attention backend %s, dtype %s, quantization %s, KV cache %d "
                "blocks x %d tokens = %d tokens", platform.name, info.device, info.attention_backend or "none",
                info.dtype, quantization or "none", info.num_blocks, info.block_size,
                info.num_blocks * info.block_size)
    start_phase("engine core set-up")
    if _phases:
        logger.info("engine start took %.1f s: %s", sum(t for _, t in _phases),
                    "; ".join(f"{name} {t:.2f} s" for name, t in _phases))
    pm.hook.octavo_on_engine_start(settings=settings, **facts)
