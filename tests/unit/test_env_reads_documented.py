"""Every ``OCTAVO_*`` variable a module reads while it is imported is named in docs/configuration.md.

tests/unit/test_env_flags.py scans the source text for ``OCTAVO_...`` literals, so a name the code builds (an
f-string, a prefix + a field name) slips past it. Here a subprocess records the keys the environment is asked for
(``os.environ[...]``, ``.get``, ``in``, ``os.getenv``: all go through ``os._Environ``) while it imports every module
of octavo, octavo.core and octavo.plugins, and the test compares what was asked with the docs. Reads that happen
later (at engine start, per request) are not seen here; the source scan covers the literal ones among them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_RECORDER = r"""
import importlib, json, os, pkgutil, sys, warnings
asked = set()
env_cls = type(os.environ)
for name in ("__getitem__", "__contains__"):
    orig = getattr(env_cls, name)
    def spy(self, key, _orig=orig):
        if isinstance(key, str) and key.startswith("OCTAVO_"):
            asked.add(key)
        return _orig(self, key)
    setattr(env_cls, name, spy)
failed = {}
warnings.simplefilter("ignore")
for top in ("octavo", "octavo.core", "octavo.plugins"):
    pkg = importlib.import_module(top)
    for info in pkgutil.walk_packages(pkg.__path__, top + "."):
        if info.name.startswith("octavo.plugins.") and ".tests" in info.name:
            continue
        try:
            importlib.import_module(info.name)
        except BaseException as e:  # a module that needs what this machine lacks (CUDA, an optional package)
            failed[info.name] = type(e).__name__
print(json.dumps({"asked": sorted(asked), "failed": failed, "modules": len(sys.modules)}))
"""


def test_every_variable_read_at_import_is_documented():
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "OCTAVO_DISABLE_PROGRESS": "1"}
    out = subprocess.run([sys.executable, "-c", _RECORDER], capture_output=True, text=True, timeout=240, env=env,
                         cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["modules"] > 200 and len(rec["asked"]) > 30, rec  # the imports ran and the spy saw reads
    documented = set(re.findall(r"OCTAVO_[A-Z0-9_]*[A-Z0-9]", (ROOT / "docs" / "configuration.md").read_text()))
    missing = sorted(set(rec["asked"]) - documented)
    assert not missing, f"read at import but not in docs/configuration.md: {missing}"
