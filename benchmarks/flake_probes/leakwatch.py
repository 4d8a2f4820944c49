"""pytest plugin (flake hunt): after each test, report threads and child processes that appeared during it and
are still alive, and process-global state it changed and left changed (env, torch threads/dtype, gc, sys.path,
switch interval, log levels)."""
import gc
import logging
import os
import sys
import threading
import time

import pytest

_log = open(os.environ.get("LEAKWATCH_LOG", "leakwatch.log"), "a")

def _threads():
    return {(t.ident, t.name) for t in threading.enumerate()}

def _kids():
    try:
        import psutil
        return {(p.pid, " ".join(p.cmdline()[:4])[:120]) for p in psutil.Process().children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE}
    except Exception:
        return set()

def _globals():
    g = {"env": dict(os.environ), "gc": (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count() > 0),
         "sys.path": list(sys.path), "switch": sys.getswitchinterval(),
         "log": (logging.getLogger().level, logging.getLogger("octavo").level, logging.getLogger("octavo").propagate)}
    if "torch" in sys.modules:
        import torch
        g["torch"] = (torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled())
    return g

def _diff(a, b):
    out = []
    for k in set(a) | set(b):
        if k == "env":
            ea, eb = a.get(k, {}), b.get(k, {})
            ch = {x: (ea.get(x), eb.get(x)) for x in set(ea) | set(eb) if ea.get(x) != eb.get(x)}
            if ch:
                out.append(f"env {ch}")
        elif a.get(k) != b.get(k):
            out.append(f"{k} {a.get(k)} -> {b.get(k)}" if k != "sys.path" else f"sys.path {set(b.get(k) or []) ^ set(a.get(k) or [])}")
    return out

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before_t, before_k, before_g = _threads(), _kids(), _globals()
    t0 = time.monotonic()
    yield
    new_t = _threads() - before_t
    new_k = _kids() - before_k
    d = _diff(before_g, _globals())
    if new_t or new_k or d:
        _log.write(f"{item.nodeid} ({time.monotonic()-t0:.1f}s): +threads {sorted(n for _, n in new_t)} +procs {sorted(c for _, c in new_k)} globals {d}\n")
        _log.flush()

def pytest_sessionfinish(session):
    _log.write(f"== end: {threading.active_count()} threads: {sorted(t.name for t in threading.enumerate())}\n")
    _log.write(f"== procs: {sorted(_kids())}\n")
    _log.flush()
