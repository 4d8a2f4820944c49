"""The cyclic garbage collector paused for ``octavo serve``'s start-up imports (issue 18 start-up, session 9).

Why: importing torch, pydantic and FastAPI allocates ~270k long-lived objects, and the full collections this
triggers took 0.16-0.31 s of the engine core's 1.3-1.6 s of import CPU (standalone A/B); in ``octavo serve`` CPU until
ready went 1.75 -> 1.64 s (core) and 1.46 -> 1.35 s (front end). The front end pauses the collector before it forks
the core (``cli/main.py``); the core resumes right after its imports, before the settings and any weights (loading
may make cyclic garbage that must be collected); the front end once the core is ready or the start failed
(``cli/serve.py``), or when it lets an unused core go (``engine_prestart.discard``). ``resume_gc`` freezes what
exists then (``gc.freeze``: the modules; the ~7k unreachable objects of the imports stay, ~0.7 MB) and collects
again from there on. The core hands that freeze back (``end_startup_freeze``) right before its serving loop freezes
the whole heap (core/gc_heap.py, which leaves alone a freeze it did not make).
"""

from __future__ import annotations

import gc

_gc_paused: list[bool] = []  # [True] while this process's start-up has the collector paused
_startup_frozen: list[bool] = []  # [True] while the objects frozen by resume_gc stay frozen


def pause_gc() -> None:
    """Pause the cyclic garbage collector for the start-up imports (see the module docstring); a forked core
    inherits the pause and ends it itself."""
    if gc.isenabled() and not _gc_paused:
        gc.disable()
        _gc_paused.append(True)


def resume_gc() -> None:
    """End ``pause_gc``'s pause (idempotent): freeze the objects that exist now, collect again from here on."""
    if _gc_paused:
        _gc_paused.clear()
        gc.freeze()
        _startup_frozen.append(True)
        gc.enable()


def end_startup_freeze() -> None:
    """Unfreeze what ``resume_gc`` froze (O(1): the objects join the oldest generation), right before a scope that
    freezes the whole heap itself (``gc_heap.frozen_heap`` skips when a freeze it did not make exists)."""
    if _startup_frozen:
        _startup_frozen.clear()
        gc.unfreeze()
