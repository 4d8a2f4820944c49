"""Compile a C source into a cached shared library (the CPU kernels of plugins/quant are C loaded with ctypes).

Why its own module: :mod:`.cpu_kernel`, :mod:`.int8_cpu_kernel`, :mod:`.cpu_int8act` and the ``cpu_paged``
attention kernel all build this way (:func:`cached_library` is their one build-load-remember helper), and
:mod:`.cpu_kernel` imports the int8-activation routing, so the builder cannot live there without an import cycle.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading

from octavo.env_flags import env_switch


def _cache_dir() -> str:
    base = os.environ.get("OCTAVO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "octavo")
    return os.path.join(base, "kernels")


def compile_shared_library(source: str, stem: str, flags: list[str]) -> str:
    """Compile C ``source`` with ``$CC flags`` into ``$OCTAVO_CACHE_DIR/kernels/<stem>_<hash>.so`` once per
    source, compiler, flags and machine; returns the path. Also used by :mod:`.int8_cpu_kernel`."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler ({cc!r} not on PATH; set CC)")
    key = hashlib.sha256("\0".join([source, cc, *flags, platform.machine(), platform.node()]).encode())
    path = os.path.join(_cache_dir(), f"{stem}_{key.hexdigest()[:16]}.so")
    with _inflight_lock:  # one build per path in this process: a caller waits for a background build (cpu_prebuild)
        lock = _inflight.setdefault(path, threading.Lock())
    with lock:
        if not os.path.exists(path):
            _compile(source, stem, flags, cc, path)
    return path


_inflight: dict[str, threading.Lock] = {}
_inflight_lock = threading.Lock()


def _compile(source: str, stem: str, flags: list[str], cc: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, f"{stem}.c"), os.path.join(tmp, f"{stem}.so")
        with open(src, "w") as f:
            f.write(source)
        proc = subprocess.run([cc, *flags, src, "-o", out, "-lm"], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        tmp_final = f"{path}.{os.getpid()}.tmp"
        shutil.copyfile(out, tmp_final)
        os.replace(tmp_final, path)  # atomic: concurrent workers never load a half-written file


#: a C function's ctypes ``(argtypes, restype)``; restype None = void
Signature = tuple[list, object]


def cached_library(state: dict, source: str, stem: str, flags: list[str], signatures: dict[str, Signature],
                   switch: str | None = None) -> ctypes.CDLL | None:
    """The library built from ``source`` (see :func:`compile_shared_library`), loaded and typed once per
    ``state`` dict (a module's memo: ``state["lib"]``, and ``state["why"]`` when it is None).

    Why one helper: the CPU kernels of plugins/quant and plugins/attention each kept the same build, load, type
    and remember-the-failure code. Returns None, with the reason in ``state["why"]``, when the compiler or the
    load fails, or when the :func:`octavo.env_flags.env_switch` ``switch`` is ``0``; callers then say what they
    run instead. The library's OpenMP regions run on torch's libgomp when torch is imported first (one runtime
    per process: ``torch.set_num_threads`` applies to both)."""
    if getattr(_collecting, "specs", None) is not None:  # collect_specs(): say what would be built, build nothing
        if switch is None or env_switch(switch):
            _collecting.specs.append((source, stem, list(flags)))
        return None
    if "lib" not in state:
        if switch is not None and not env_switch(switch):
            state["lib"], state["why"] = None, f"disabled by {switch}=0"
        else:
            try:
                lib = ctypes.CDLL(compile_shared_library(source, stem, flags))
                for name, (argtypes, restype) in signatures.items():
                    fn = getattr(lib, name)
                    fn.argtypes, fn.restype = argtypes, restype
                state["lib"] = lib
            except (OSError, RuntimeError) as e:
                state["lib"], state["why"] = None, str(e)
    return state["lib"]


_collecting = threading.local()


def collect_specs(call) -> list[tuple[str, str, list[str]]]:
    """The ``(source, stem, flags)`` that ``call()`` (a kernel module's ``library``) would build through
    :func:`cached_library`, found without compiling or loading anything and without touching its memo.

    Why: :mod:`octavo.plugins.platforms.cpu_prebuild` compiles a platform's kernels in parallel, in the
    background, before the model's first step asks for them one by one (cold start). A ``call`` that raises
    because it got None (no library) is fine: what it asked for was recorded before."""
    _collecting.specs = specs = []
    try:
        call()
    except Exception:  # noqa: BLE001 - a wrapper's reaction to the None it got; the spec is already recorded
        pass
    finally:
        _collecting.specs = None
    return specs
