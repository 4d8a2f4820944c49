"""Triton kernels shipped with the install: a fresh machine starts with the kernels already compiled (issue 17).
The GPU platforms' ``Platform.install_shipped_kernels`` (plugins/platforms/cuda.py) runs :func:`seed_triton_cache`
once per worker, before the model loads.

A cold start of the Llama-3-8B shape on an H100 spent ~7 s compiling Triton kernels (fusions, attention,
graph capture) that a second start reads from Triton's cache (docs/performance.md, "Start-up"). Triton keys
each cache entry by a hash of the kernel source, its compile options, the target (e.g. ``cuda:90``) and
Triton's own build, so an entry compiled on the same Triton version and GPU architecture is valid on any such
machine, and useless (never looked up) on another. ``kernel_caches/triton-<version>-<tag>.tar.xz`` archives
(made by ``benchmarks/gpu_start.py --keep-cache`` on the device) are unpacked into the user's Triton cache
once, entry by entry, never over an existing entry; a marker file records that an archive was unpacked there.

Nothing happens (and Triton is not imported) when no archive matches the installed Triton version, or with
``OCTAVO_SHIPPED_KERNELS=0``.
"""

from __future__ import annotations

import logging
import lzma
import os
import shutil
import tarfile
import tempfile
import time
from glob import glob

logger = logging.getLogger(__name__)

ARCHIVE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_caches")


def _triton_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:
        return None


def triton_cache_dir() -> str:
    """Where this process's Triton reads and writes its cache: ``triton.knobs.cache.dir`` if Triton is already
    imported (it may have been set in code), else what it resolves to without importing Triton (~0.3 s):
    ``TRITON_CACHE_DIR``, or ``$TRITON_HOME/.triton/cache`` (home directory by default)."""
    import sys

    if "triton" in sys.modules:
        try:
            from triton import knobs

            return knobs.cache.dir
        except (ImportError, AttributeError):  # older Triton: no knobs
            pass
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~/")
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache")


def _relocate_groups(entry_dir: str, dest: str) -> None:
    """Point an entry's ``__grp__*.json`` files at ``dest``: Triton stores absolute paths of a kernel's files
    there and treats the entry as missing (recompiles) when they do not exist (GPU batch 2: every shipped kernel
    was recompiled until this)."""
    import json

    for name in os.listdir(entry_dir):
        if not (name.startswith("__grp__") and name.endswith(".json")):
            continue
        path = os.path.join(entry_dir, name)
        try:
            with open(path) as f:
                group = json.load(f)
            group["child_paths"] = {child: os.path.join(dest, os.path.basename(p))
                                    for child, p in group["child_paths"].items()}
        except (OSError, ValueError, KeyError, AttributeError):
            continue  # not a group file Triton wrote: leave it, Triton recompiles that entry
        with open(path, "w") as f:
            json.dump(group, f)


def _extract(archive: str, dest: str) -> None:
    with tarfile.open(archive, "r:xz") as tar:
        try:
            tar.extractall(dest, filter="data")  # plain files and folders only
        except TypeError:  # Python without extraction filters
            tar.extractall(dest)


def seed_triton_cache(archive_dir: str = ARCHIVE_DIR, cache_dir: str | None = None) -> int | None:
    """Unpack the shipped archives for the installed Triton into its cache; returns the entries added (None:
    no archive for this Triton version)."""
    from octavo.env_flags import env_switch

    if not env_switch("OCTAVO_SHIPPED_KERNELS", True):  # 0: compile everything here (measure a truly cold start)
        return None
    archives = sorted(glob(os.path.join(archive_dir, "triton-*.tar.xz"))) if os.path.isdir(archive_dir) else []
    version = _triton_version() if archives else None
    archives = [a for a in archives if os.path.basename(a).startswith(f"triton-{version}-")] if version else []
    if not archives:
        return None
    t0 = time.perf_counter()
    cache_dir = cache_dir or triton_cache_dir()
    os.makedirs(cache_dir, exist_ok=True)
    added = 0
    for archive in archives:
        marker = os.path.join(cache_dir, f".octavo-seeded-{os.path.basename(archive)}-{os.path.getsize(archive)}")
        if os.path.exists(marker):
            continue
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".octavo-seed-") as tmp:
            try:
                _extract(archive, tmp)
            except (tarfile.TarError, EOFError, OSError, lzma.LZMAError) as e:
                # the archive only saves compile time: a damaged one (a truncated copy, one being rewritten while
                # read) must not stop the engine; its kernels compile at first use instead, and no marker is written
                logger.warning("Shipped Triton kernels %s unreadable (%s: %s): not used, kernels compile at first "
                               "use", archive, type(e).__name__, e)
                continue
            for root in os.listdir(tmp):  # one top folder ("triton_cache") holding one folder per entry
                for entry in os.listdir(os.path.join(tmp, root)):
                    dest = os.path.join(cache_dir, entry)
                    if os.path.exists(dest):
                        continue
                    _relocate_groups(os.path.join(tmp, root, entry), dest)
                    try:
                        os.rename(os.path.join(tmp, root, entry), dest)  # atomic: a reader sees all or nothing
                        added += 1
                    except OSError:  # another process placed it first
                        shutil.rmtree(os.path.join(tmp, root, entry), ignore_errors=True)
        with open(marker, "w"):
            pass
    logger.info("Triton cache %s: %d shipped kernel entries added in %.2f s", cache_dir, added,
                time.perf_counter() - t0)
    return added
