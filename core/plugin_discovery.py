"""Plugin discovery: the entry points of group ``octavo``, read from the installed distributions' metadata once
per process and read again only when that metadata changed.

Why a cache: ``importlib.metadata.entry_points()`` opens and parses every installed distribution's
``entry_points.txt`` (~100 in the dev venv, 7-20 ms), and every ``PluginManager`` used to pay that again
(``reload_plugins()``, tests, tools). Why it stays correct: the cached answer is keyed on what it was read
from, checked on every call for a fraction of the read's cost (one ``scandir`` per ``sys.path`` folder, three
``stat`` calls per distribution):

- ``sys.path`` itself (a folder added or removed, the working directory for ``""``);
- in each folder, the names of the ``*.dist-info`` / ``*.egg-info`` entries (``pip install`` / ``uninstall``
  add and remove them; an upgrade renames them, the version is in the name);
- for each distribution, ``stat`` (mtime, size, inode) of its ``*-info`` entry, of ``entry_points.txt`` and of
  ``METADATA`` (``PKG-INFO`` for an egg): a file edited or rewritten in place;
- a file modified in the last ``_RACY_S`` seconds makes the answer uncacheable: file times tick coarsely
  (a few ms), so a second same-size write inside one tick would keep the same key (git's "racily clean").

A zip or plain file on ``sys.path`` counts by its own ``stat``. Distributions that a custom
``sys.meta_path`` finder serves (not files on ``sys.path``) are not watched: call :func:`clear_cache`
(``octavo.registry.reload_plugins(rescan=True)``) after changing them.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import sys
import threading
import time

from octavo.core.plugin_registry import BUILTIN_DISTRIBUTION, norm
from octavo.hooks import ENTRY_POINT_GROUP

#: files changed this recently are not trusted to change their stat signature on the next write
_RACY_S = 2.0
_INFO_SUFFIXES = (".dist-info", ".egg-info")

_cache: tuple[tuple, list[metadata.EntryPoint]] | None = None
_lock = threading.Lock()


def discover() -> list[metadata.EntryPoint]:
    """Entry points of group ``octavo``, de-duplicated (a distribution seen twice on sys.path counts once),
    third-party first and built-ins last, each group sorted by name, so load order is stable. A new list
    each call (the entry point objects are shared; they are immutable)."""
    global _cache
    with _lock:
        key = _metadata_state()
        if _cache is not None and key is not None and _cache[0] == key:
            return list(_cache[1])
        eps = _read()
        _cache = (key, eps) if key is not None else None
        return list(eps)


def clear_cache() -> None:
    """Forget the cached entry points: the next :func:`discover` reads the metadata again."""
    global _cache
    with _lock:
        _cache = None


def _read() -> list[metadata.EntryPoint]:
    seen, eps = set(), []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else ""
        if (norm(dist), ep.name) not in seen:
            seen.add((norm(dist), ep.name))
            eps.append(ep)
    return sorted(eps, key=lambda ep: (norm(ep.dist.name if ep.dist else "") == BUILTIN_DISTRIBUTION, ep.name))


def _signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def _metadata_state() -> tuple | None:
    """The key of what :func:`_read` depends on (see the module doc), or ``None`` if a file is too fresh."""
    state: list = []
    for entry in sys.path:
        root = os.path.abspath(entry or ".")
        try:
            with os.scandir(root) as it:
                infos = sorted(e.name for e in it if e.name.endswith(_INFO_SUFFIXES))
        except NotADirectoryError:
            state.append((root, _signature(root)))  # a zip (or egg) file on sys.path
            continue
        except OSError:
            state.append((root, None))
            continue
        state.append((root, len(infos)))
        for name in infos:
            info = os.path.join(root, name)  # a folder, or an egg-info file
            meta = "METADATA" if name.endswith(".dist-info") else "PKG-INFO"
            state.append((name, _signature(info), _signature(os.path.join(info, "entry_points.txt")),
                          _signature(os.path.join(info, meta))))
    newest = max((sig[0] for item in state for sig in item[1:] if isinstance(sig, tuple)), default=0)
    if newest > time.time_ns() - int(_RACY_S * 1e9):
        return None
    return tuple(state)
