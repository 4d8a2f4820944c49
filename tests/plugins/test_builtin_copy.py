"""The built-ins need nothing a third-party plugin cannot do: a verbatim copy of the CPU platform
(``plugins/platforms/cpu.py``) and the reference attention backend (``plugins/attention/torch_sdpa.py``) is
packaged as an external distribution, ``octavo-copycat``, pip-installed (a real wheel build, into a
private target directory), and with the built-in platform and attention plugins disabled
(``OCTAVO_DISABLE_PLUGINS=platforms,attention``) it

- passes the contract kits (``PlatformContract``, ``AttentionBackendContract`` against float64 attention)
  in its own test run, and
- serves an end-to-end generation with the embedded SmolLM2 model: the engine selects the copies, logs
  them, and tells ``octavo_on_engine_start`` plugins so.

The copied files are checked to import only public octavo modules.
"""

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COPIES = {"cpu.py": ROOT / "plugins" / "platforms" / "cpu.py", "torch_sdpa.py": ROOT / "plugins" / "attention" / "torch_sdpa.py",
          "cpu_compiled.py": ROOT / "plugins" / "platforms" / "cpu_compiled.py"}  # cpu.py's compiled decode step

PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "octavo-copycat"
version = "1.0.0"
dependencies = ["octavo"]

[project.entry-points.octavo]
copycat = "octavo_copycat"

[tool.setuptools]
packages = ["octavo_copycat"]
"""

INIT = '''
"""A verbatim copy of two octavo built-ins, shipped as a third-party plugin."""
import json
import os

from octavo import hookimpl


@hookimpl
def octavo_register_platforms(register):
    register("cpu", "octavo_copycat.cpu:CpuPlatform")


@hookimpl
def octavo_register_attention_backends(register):
    register("torch_sdpa", "octavo_copycat.torch_sdpa:TorchSDPABackend")


@hookimpl
def octavo_on_engine_start(platform, attention_backend, dtype, quantization, num_kv_blocks, block_size):
    with open(os.environ["COPYCAT_START_FILE"], "w") as f:
        json.dump(dict(platform=platform, attention_backend=attention_backend, dtype=dtype,
                       quantization=quantization, num_kv_blocks=num_kv_blocks, block_size=block_size), f)
'''

CONTRACT_TESTS = '''
import torch

from octavo.registry import resolve
from octavo.testing import AttentionBackendContract, PlatformContract
from octavo_copycat.cpu import CpuPlatform
from octavo_copycat.torch_sdpa import TorchSDPABackend


def test_the_copies_are_what_octavo_resolves():
    assert resolve("platforms", "cpu") is CpuPlatform
    assert resolve("attention_backends", "torch_sdpa") is TorchSDPABackend


class TestCopiedCpu(PlatformContract):
    platform_cls = CpuPlatform


class TestCopiedTorchSDPA(AttentionBackendContract):
    backend_cls = TorchSDPABackend
    dtypes = (torch.float32,)  # the built-in's own run covers every dtype, block size and head layout
    block_sizes = (16,)
    head_configs = ((8, 2, 64), (6, 1, 32))
'''

GENERATE = '''
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
from octavo import LLM, SamplingParams
llm = LLM(max_model_len=256, kv_cache_memory_bytes=32 << 20)
out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=6, temperature=0))
mods = ["octavo_copycat.cpu", "octavo_copycat.torch_sdpa", "octavo.plugins.platforms.cpu",
        "octavo.plugins.attention.torch_sdpa"]
print("MODULES:" + ",".join(m for m in mods if m in sys.modules))
print("TEXT:" + repr(out[0].outputs[0].text))
'''


def _public_only(path: Path) -> list[str]:
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        bad += [n for n in names if n.startswith(("octavo.core", "octavo.plugins"))]
    return bad


@pytest.fixture(scope="module")
def copycat(tmp_path_factory) -> dict:
    """Build and pip-install octavo-copycat; return the environment that loads it instead of the built-ins."""
    src, site = tmp_path_factory.mktemp("copycat-src"), tmp_path_factory.mktemp("copycat-site")
    pkg = src / "octavo_copycat"
    pkg.mkdir()
    for name, original in COPIES.items():
        shutil.copyfile(original, pkg / name)
    (pkg / "__init__.py").write_text(textwrap.dedent(INIT))
    (src / "pyproject.toml").write_text(PYPROJECT)
    (src / "tests").mkdir()
    (src / "tests" / "test_contract.py").write_text(textwrap.dedent(CONTRACT_TESTS))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(src)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCTAVO_")}
    env.update(PYTHONPATH=str(site), OCTAVO_DISABLE_PLUGINS="platforms,attention", OCTAVO_PLUGINS="copycat",
               COPYCAT_START_FILE=str(src / "start.json"))
    return {"src": src, "site": site, "env": env}


def test_copied_modules_import_only_public_octavo():
    for name, original in COPIES.items():
        assert _public_only(original) == [], f"{name} imports internals"


def test_installed_copy_is_discovered_and_builtins_are_off(copycat):
    out = subprocess.run([sys.executable, "-m", "octavo.cli.main", "plugins", "--json"], capture_output=True,
                         text=True, env=copycat["env"], check=True, timeout=120)
    report = {p["name"]: p for p in json.loads(out.stdout)}
    assert "platforms" not in report and "attention" not in report
    regs = {(r["kind"], r["name"]): r for r in report["copycat"]["registrations"]}
    assert report["copycat"]["distribution"] == "octavo-copycat"
    assert regs[("platforms", "cpu")]["available"] and regs[("attention_backends", "torch_sdpa")]["available"]
    assert str(copycat["site"]) in _module_file(copycat, "octavo_copycat")


def _module_file(copycat, module: str) -> str:
    return subprocess.run([sys.executable, "-c", f"import {module}; print({module}.__file__)"], capture_output=True,
                          text=True, env=copycat["env"], check=True).stdout


def test_copy_passes_the_contract_kits(copycat):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=copycat["src"], capture_output=True, text=True, env=copycat["env"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "failed" not in summary and "error" not in summary


@pytest.mark.slow
def test_end_to_end_generation_through_the_copy(copycat):
    proc = subprocess.run([sys.executable, "-c", GENERATE], capture_output=True, text=True, env=copycat["env"],
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = ast.literal_eval(proc.stdout.split("TEXT:")[-1].strip())
    assert text.strip(), "the generation is empty"
    start = json.loads((copycat["src"] / "start.json").read_text())
    assert start["platform"] == "cpu" and start["attention_backend"] == "torch_sdpa"
    from octavo.plugins.platforms.cpu import CpuPlatform  # the copy's default: bf16 where native, else fp32

    assert start["dtype"] == CpuPlatform().default_dtype() and start["num_kv_blocks"] > 0 and start["block_size"] > 0
    assert start["quantization"] == "gguf"  # the embedded SmolLM2 is a GGUF checkpoint
    assert "platform cpu (chosen by the built-in default)" in proc.stderr
    assert "engine start: platform cpu" in proc.stderr
    # the engine (in-process for LLM) ran the copies, and never imported the built-in modules
    modules = proc.stdout.split("MODULES:")[-1].splitlines()[0].split(",")
    assert modules == ["octavo_copycat.cpu", "octavo_copycat.torch_sdpa"]
