"""Installed-distribution builders for the plugin manager tests: each test writes a plugin package and its
``.dist-info`` (entry point in group ``octavo``) into a directory on sys.path, exactly what ``pip install``
leaves behind, and loads a fresh PluginManager over it. OCTAVO_PLUGINS keeps other third-party plugins out.

    def test_x(site, monkeypatch):  # ``site``: the fixture in tests/unit/conftest.py
        name, dist = make_dist(site, body)
        only(monkeypatch, name)
"""

import itertools
import os
import textwrap
import time

_ids = itertools.count()

CPU_SUBCLASS = """
from octavo import hookimpl
from octavo.plugins.platforms.cpu import CpuPlatform

class Plat(CpuPlatform):
    name = "PLATFORM"
"""


def make_dist(site, body: str, *, version: str = "0.1.0") -> tuple[str, str]:
    """Write a one-module distribution whose entry point is the module; return (plugin name, dist name).
    ``MODULE`` in ``body`` becomes the module's import name (unique per call, so sys.modules never caches)."""
    n = next(_ids)
    module, dist = f"octavo_fake_{n}", f"octavo-fake-{n}"
    (site / f"{module}.py").write_text(textwrap.dedent(body).replace("MODULE", module))
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[octavo]\nfake{n} = {module}\n")
    return f"fake{n}", dist


def only(monkeypatch, *names):
    monkeypatch.setenv("OCTAVO_PLUGINS", ",".join(names))


def age(path, seconds: float = 60.0) -> None:
    """Date ``path`` and everything below it ``seconds`` back, as files of an install made earlier look
    (plugin discovery does not cache what was written in the last two seconds)."""
    when = time.time() - seconds
    for root, _, files in os.walk(path):
        for name in files:
            os.utime(os.path.join(root, name), (when, when))
        os.utime(root, (when, when))
