"""Every hook is specified with a docstring and documented in docs/plugins.md, and the docs' one-file
example plugin really runs when installed."""

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from octavo.core import hookspecs

DOCS = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
SPECS = {name: fn for name, fn in vars(hookspecs).items() if hasattr(fn, "octavo_spec")}


def test_there_are_hookspecs_and_each_has_a_lifecycle_group():
    assert len(SPECS) >= 12
    assert set(SPECS) == set(hookspecs.HOOK_GROUPS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_hookspec_has_a_docstring_saying_when_and_where(name):
    doc = inspect.getdoc(SPECS[name]) or ""
    assert len(doc.split()) >= 15, f"{name} needs a docstring: when it runs, in which process, its contract"
    assert "Process:" in doc, f"{name}'s docstring must say in which process it runs"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_hook_documented_in_docs_with_its_signature(name):
    text = DOCS.read_text()
    match = re.search(rf"^#### `{name}\(([^)]*)\)`", text, re.M)
    assert match, f"docs/plugins.md has no '#### `{name}(...)`' section"
    documented = [a.strip() for a in match.group(1).split(",") if a.strip()]
    assert documented == list(inspect.signature(SPECS[name]).parameters), f"{name}: docs and spec disagree"


def _block(text: str, lang: str, must_contain: str) -> str:
    for block in re.findall(rf"```{lang}\n(.*?)```", text, re.S):
        if must_contain in block:
            return block
    raise AssertionError(f"docs/plugins.md has no ```{lang} block containing {must_contain!r}")


def test_docs_example_plugin_runs(tmp_path):
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    text = DOCS.read_text()
    source = _block(text, "python", "# octavo_hello.py")
    project = tomllib.loads(_block(text, "toml", "[project.entry-points.octavo]"))["project"]
    (ep_name, module), = project["entry-points"]["octavo"].items()
    (tmp_path / f"{module}.py").write_text(source)
    info = tmp_path / f"{module}-{project['version']}.dist-info"  # what `pip install` leaves behind
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text(f"[octavo]\n{ep_name} = {module}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OCTAVO_PLUGINS": ep_name}

    def octavo(*args):
        proc = subprocess.run([sys.executable, "-m", "octavo.cli.main", *args], capture_output=True, text=True,
                              env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert octavo("hello", "you") == "hello, you\n"
    plugin = next(p for p in json.loads(octavo("plugins", "--json")) if p["name"] == ep_name)
    assert plugin["distribution"] == project["name"] and plugin["error"] is None
    assert plugin["hooks"] == ["octavo_add_cli_commands", "octavo_register_models", "octavo_register_stat_loggers"]
    assert [(r["kind"], r["name"]) for r in plugin["registrations"]] == [("models", "HelloLlamaForCausalLM")]
