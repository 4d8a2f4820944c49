"""Compile a C source into a cached shared library (the CPU kernels of plugins/quant are C loaded with ctypes).

Why its own module: :mod:`.cpu_kernel`, :mod:`.int8_cpu_kernel` and :mod:`.cpu_int8act` all build this way, and
:mod:`.cpu_kernel` imports the int8-activation routing, so the builder cannot live there without an import cycle.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile


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
    if not os.path.exists(path):
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
    return path
