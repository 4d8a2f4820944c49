"""The contract-kit examples in docs/plugins.md run: every ```python block that starts with ``# test_...py`` is
written to that file in a fresh directory and run by pytest in a subprocess, as a plugin author would run
them. The examples import only public modules (checked here too)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def _examples() -> dict[str, str]:
    blocks = re.findall(r"```python\n(# (test_\w+\.py)\n.*?)```", DOCS.read_text(), re.S)
    return {name: body for body, name in blocks}


def test_every_kit_has_an_example():
    assert set(_examples()) >= {"test_platform_contract.py", "test_attention_contract.py",
                                "test_model_contract.py", "test_paged_runner.py"}


def test_examples_import_only_public_modules():
    for name, body in _examples().items():
        for node in ast.walk(ast.parse(body)):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("octavo.core", "octavo.plugins")), f"{name}: {node.module}"


def test_kit_examples_pass(tmp_path):
    for name, body in _examples().items():
        (tmp_path / name).write_text(body)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "failed" not in summary and "error" not in summary
