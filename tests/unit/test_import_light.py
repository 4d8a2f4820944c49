"""``import octavo`` (and the plugin author's imports) must not pull in torch, FastAPI or transformers."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "fastapi", "transformers")


@pytest.mark.parametrize("stmt", [
    "import octavo",
    "from octavo import hookimpl, __version__",
    "import octavo.testing",
    "from octavo.cli.main import BUILTIN_COMMANDS",
])
def test_light_import(stmt):
    code = f"{stmt}; import sys; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"{stmt!r} imported {out.stdout.strip()}"


def test_lazy_names_resolve():
    code = "import octavo; octavo.Platform; octavo.OctavoSettings; import sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
