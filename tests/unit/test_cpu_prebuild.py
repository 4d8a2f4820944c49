"""The CPU kernels' background prebuild (plugins/platforms/cpu_prebuild.py, issue 18 cold start): it finds the
sources the kernels' own ``library()`` would build without building or loading them, builds each file once
per process even when a ``library()`` call races it, honours the kernels' off switches, and leaves exactly
the files that ``library()`` then loads without compiling. Small kernels only (rope, SiLU: ~1-2 s of cc)."""

from __future__ import annotations

import ctypes
import os
import threading

import pytest

from octavo.plugins.platforms import cpu_prebuild, cpu_rope, cpu_silu
from octavo.plugins.quant import cpu_build


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(tmp_path))
    return tmp_path / "kernels"


def test_specs_list_every_kernel_longest_first_and_build_nothing(cache):
    state_before = dict(cpu_rope._state)
    stems = [stem for _, stem, _ in cpu_prebuild.specs()]
    assert stems[0] == "octavo_paged_attn"  # the longest build starts first
    assert {"octavo_fused_decode", "octavo_cpu_norm", "octavo_cpu_rope", "octavo_cpu_silu", "octavo_q"} <= set(stems)
    assert not cache.exists()  # nothing compiled
    assert cpu_rope._state == state_before  # the kernel's memo is untouched


def test_spec_is_what_library_builds(cache):
    (source, stem, flags), = cpu_build.collect_specs(cpu_rope.library)
    assert (source, stem, flags) == (cpu_rope.C_SOURCE, "octavo_cpu_rope", cpu_rope._FLAGS)


def test_off_switch_means_no_build(cache, monkeypatch):
    monkeypatch.setenv(cpu_rope.SWITCH, "0")
    assert cpu_build.collect_specs(cpu_rope.library) == []


def test_prebuild_then_library_loads_without_compiling(cache, monkeypatch):
    monkeypatch.setattr(cpu_prebuild, "KERNELS", (("octavo.plugins.platforms.cpu_rope", "library"),
                                                  ("octavo.plugins.platforms.cpu_silu", "library"),
                                                  ("octavo.plugins.platforms.no_such_kernel", "library")))
    monkeypatch.setattr(cpu_prebuild, "_started", [])
    monkeypatch.setattr(cpu_prebuild, "_errors", {})
    monkeypatch.setattr(cpu_prebuild, "_seconds", {})
    assert cpu_prebuild.start(workers=2) == 2
    done = cpu_prebuild.wait(timeout=600)
    assert set(done) == {"octavo_cpu_rope", "octavo_cpu_silu"} and not cpu_prebuild._errors
    built = sorted(os.listdir(cache))
    assert [name.rsplit("_", 1)[0] for name in built] == ["octavo_cpu_rope", "octavo_cpu_silu"]
    mtimes = {name: os.stat(cache / name).st_mtime_ns for name in built}
    for module in (cpu_rope, cpu_silu):
        state: dict = {}  # a fresh memo: load as a new process would
        (source, stem, flags), = cpu_build.collect_specs(module.library)
        lib = cpu_build.cached_library(state, source, stem, flags, {})
        assert isinstance(lib, ctypes.CDLL), state.get("why")
    assert sorted(os.listdir(cache)) == built  # no new file, none rebuilt
    assert {name: os.stat(cache / name).st_mtime_ns for name in built} == mtimes


def test_one_build_per_file_when_calls_race(cache, monkeypatch):
    calls = []
    real = cpu_build._compile
    monkeypatch.setattr(cpu_build, "_compile", lambda *a: (calls.append(a[1]), real(*a)))
    source = "int answer(void) { return 42; }\n"
    paths: list[str] = []
    threads = [threading.Thread(target=lambda: paths.append(
        cpu_build.compile_shared_library(source, "octavo_test_race", ["-O1", "-shared", "-fPIC"]))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(paths) == 4 and len(set(paths)) == 1 and calls == ["octavo_test_race"]
    assert ctypes.CDLL(paths[0]).answer() == 42


def test_prebuild_off_switch(cache, monkeypatch):
    monkeypatch.setenv("OCTAVO_CPU_PREBUILD", "0")
    monkeypatch.setattr(cpu_prebuild, "_started", [])
    assert cpu_prebuild.start() == 0 and not cache.exists()
