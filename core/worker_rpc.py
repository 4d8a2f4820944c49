"""``collective_rpc``'s worker side: what a method name means when the engine calls it on every rank.

    "sleep" / "wake_up" / "reload_weights"   octavo's worker functions (core/sleep_mode.py)
    "pkg.module:function"                    ``function(worker, *args, **kwargs)`` (any process: a name, no pickle)
    any other public name                    the worker's own method (``info``, ...)
    a callable (in-process executors only)   ``method(worker, *args, **kwargs)``, as vLLM calls one
"""

from __future__ import annotations

from typing import Any

from octavo.core.sleep_mode import reload_weights, sleep_worker, wake_worker
from octavo.executor import resolve_target

WORKER_FUNCTIONS = {"sleep": sleep_worker, "wake_up": wake_worker, "reload_weights": reload_weights}


def call_worker(worker: Any, method: Any, args: list, kwargs: dict) -> Any:
    """Run one ``collective_rpc`` call on this worker and return its result.

    Raises:
        AttributeError: an unknown or private method name.
    """
    if callable(method):
        return method(worker, *args, **kwargs)
    if not isinstance(method, str):
        raise TypeError(f"collective_rpc: method must be a name or a callable, got {type(method).__name__}.")
    if ":" in method:
        return resolve_target(method)(worker, *args, **kwargs)
    fn = WORKER_FUNCTIONS.get(method)
    if fn is not None:
        return fn(worker, *args, **kwargs)
    target = None if method.startswith("_") else getattr(worker, method, None)
    if not callable(target):
        raise AttributeError(f"collective_rpc: the worker has no public method {method!r} (octavo's: "
                             f"{sorted(WORKER_FUNCTIONS)}, or 'module:function' called with the worker).")
    return target(*args, **kwargs)
