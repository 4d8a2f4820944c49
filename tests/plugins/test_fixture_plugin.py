"""A real third-party plugin, pip-installed into this venv for the module: discovered through its entry
point, shadows the built-in ``cpu`` platform, disappears when disabled, obeys the allow-list, adds a CLI
command and passes its own PlatformContract suite. Every check runs ``octavo`` in a fresh process, as a
user would after ``pip install``."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "octavo-fixture-plugin"
PLUGIN, DIST = "fixture", "octavo-fixture-plugin"


# pip installs the fixture into a private --target directory, not the shared venv, so other test runs on this
# machine never see it shadowing `cpu`; every process here gets that directory on PYTHONPATH.
SITE: list[str] = []


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OCTAVO_PLUGINS", "OCTAVO_DISABLE_PLUGINS")}
    env.update(extra)
    paths = [*SITE, extra.get("PYTHONPATH"), os.environ.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def octavo(*args, check=True, **env) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "octavo.cli.main", *args], capture_output=True, text=True,
                          env=_env(**env), timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def plugins_json(**env) -> dict:
    return {p["name"]: p for p in json.loads(octavo("plugins", "--json", **env).stdout)}


@pytest.fixture(scope="module", autouse=True)
def installed(tmp_path_factory):
    site = tmp_path_factory.mktemp("fixture-site")
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(FIXTURE)], check=True, timeout=300)
    SITE[:] = [str(site)]
    try:
        yield
    finally:
        SITE.clear()
        shutil.rmtree(FIXTURE / "build", ignore_errors=True)


@pytest.fixture(scope="module")
def other(tmp_path_factory) -> dict:
    """A second third-party plugin, installed the way pip leaves one (a module plus its .dist-info);
    returns the environment that puts it on the path."""
    site = tmp_path_factory.mktemp("site")
    (site / "octavo_other.py").write_text("")
    info = site / "octavo_other-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: octavo-other\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[octavo]\nother = octavo_other\n")
    return {"PYTHONPATH": str(site)}


# Each `octavo` process imports torch (availability checks), so the common answers are computed once.
@pytest.fixture(scope="module")
def report(other) -> dict:
    return plugins_json(**other)


@pytest.fixture(scope="module")
def table() -> str:
    return octavo("plugins").stdout


def test_discovered_with_its_distribution_and_hooks(report):
    plugin = report[PLUGIN]
    assert (plugin["distribution"], plugin["version"], plugin["error"]) == (DIST, "0.1.0", None)
    assert set(plugin["hooks"]) == {"octavo_register_platforms", "octavo_register_stat_loggers",
                                    "octavo_on_engine_start", "octavo_add_cli_commands"}
    regs = {r["name"]: r for r in plugin["registrations"]}
    assert regs["cpu"]["target"] == "octavo_fixture_plugin.platforms:FixtureCpuPlatform"
    assert regs["cpu"]["shadowed_by"] is None and regs["cpu"]["available"] is True
    assert regs["fixture_absent"]["available"] is False
    assert "never installed" in regs["fixture_absent"]["reason"]
    assert report["other"]["distribution"] == "octavo-other"


def _builtin_cpu(report) -> dict:
    return next(r for r in report["platforms"]["registrations"] if r["name"] == "cpu")


def test_shadows_the_builtin_cpu_platform(report, table):
    assert report["platforms"]["distribution"] == "octavo"
    assert _builtin_cpu(report)["shadowed_by"] == f"{PLUGIN} ({DIST})"
    assert f"shadowed by {PLUGIN} ({DIST})" in table
    assert "default platform here: cpu (chosen by the built-in default" in table  # never a silent default


def test_disappears_when_disabled():
    report = plugins_json(OCTAVO_DISABLE_PLUGINS=PLUGIN)
    assert PLUGIN not in report and "platforms" in report
    assert _builtin_cpu(report)["shadowed_by"] is None
    # the distribution name works too
    out = octavo("plugins", OCTAVO_DISABLE_PLUGINS=DIST).stdout
    assert f"not loaded (OCTAVO_DISABLE_PLUGINS / OCTAVO_PLUGINS): {PLUGIN}" in out and "shadowed" not in out


def test_allow_list(report, other):
    assert {PLUGIN, "other", "platforms"} <= set(report)
    allowed = plugins_json(OCTAVO_PLUGINS=PLUGIN, **other)
    assert PLUGIN in allowed and "other" not in allowed and "platforms" in allowed  # built-ins always load
    proc = octavo("plugins", check=False, OCTAVO_PLUGINS="octavo-fixture-plugn")
    assert proc.returncode == 2 and "octavo-fixture-plugn" in proc.stderr and "not installed" in proc.stderr


def test_adds_a_cli_command_that_reads_settings_flags():
    out = octavo("fixture-hello", "--max-num-seqs", "3").stdout
    assert out.strip() == "hello from octavo-fixture-plugin: platform=FixtureCpuPlatform max_num_seqs=3"
    out = octavo("fixture-hello", OCTAVO_DISABLE_PLUGINS=PLUGIN, check=False)
    assert out.returncode == 2 and "invalid choice: 'fixture-hello'" in out.stderr


def test_selected_platform_stat_logger_and_engine_start():
    code = """
from octavo.config import OctavoSettings
from octavo.registry import get_plugin_manager
import octavo_fixture_plugin
pm = get_plugin_manager()
platform = pm.select_platform(OctavoSettings())
(logger,) = pm.stat_loggers(OctavoSettings())
logger.record(None, [1, 2])
pm.hook.octavo_on_engine_start(settings=OctavoSettings.from_kwargs(max_num_seqs=5))
print(type(platform).__name__, type(logger).__name__, logger.num_steps, logger.num_outputs,
      octavo_fixture_plugin.STARTED[0].scheduler.max_num_seqs)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True)
    assert out.stdout.split() == ["FixtureCpuPlatform", "StepCounter", "1", "2", "5"]


def test_fixture_passes_its_own_contract_suite():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=FIXTURE,
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = proc.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "failed" not in summary and "error" not in summary
