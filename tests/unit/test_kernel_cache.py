"""Shipped Triton cache archives (plugins/platforms/cuda_kernel_cache.py) are unpacked once, entry by entry, never over an entry,
and only for the Triton version they were built with."""

from __future__ import annotations

import os
import tarfile

import pytest

from octavo.plugins.platforms import cuda_kernel_cache as kernel_cache


def _archive(tmp_path, name: str, entries: dict[str, str]) -> str:
    src = tmp_path / "src" / "triton_cache"
    for entry, text in entries.items():
        (src / entry).mkdir(parents=True)
        (src / entry / "kernel.json").write_text(text)
    d = tmp_path / "archives"
    d.mkdir(exist_ok=True)
    with tarfile.open(d / name, "w:xz") as tar:
        tar.add(src, arcname="triton_cache")
    return str(d)


def test_group_files_point_into_the_cache(tmp_path, monkeypatch):
    """Triton's ``__grp__`` files hold absolute paths (of the machine that compiled): rewritten on seeding."""
    import json

    monkeypatch.setattr(kernel_cache, "_triton_version", lambda: "9.9.9")
    src = tmp_path / "src" / "triton_cache" / "HASH"
    src.mkdir(parents=True)
    (src / "k.cubin").write_text("bin")
    (src / "__grp__k.json").write_text(json.dumps({"child_paths": {"k.cubin": "/elsewhere/HASH/k.cubin"}}))
    archives = tmp_path / "archives"
    archives.mkdir()
    with tarfile.open(archives / "triton-9.9.9-x.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "src" / "triton_cache", arcname="triton_cache")
    cache = tmp_path / "cache"
    assert kernel_cache.seed_triton_cache(str(archives), str(cache)) == 1
    group = json.loads((cache / "HASH" / "__grp__k.json").read_text())
    assert group["child_paths"]["k.cubin"] == str(cache / "HASH" / "k.cubin")
    assert os.path.exists(group["child_paths"]["k.cubin"])


def test_seed_once_without_overwriting(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_cache, "_triton_version", lambda: "9.9.9")
    archives = _archive(tmp_path, "triton-9.9.9-sm90.tar.xz", {"AAA": "shipped a", "BBB": "shipped b"})
    cache = tmp_path / "cache"
    (cache / "BBB").mkdir(parents=True)
    (cache / "BBB" / "kernel.json").write_text("local b")
    assert kernel_cache.seed_triton_cache(archives, str(cache)) == 1
    assert (cache / "AAA" / "kernel.json").read_text() == "shipped a"
    assert (cache / "BBB" / "kernel.json").read_text() == "local b"
    assert kernel_cache.seed_triton_cache(archives, str(cache)) == 0  # marker: not unpacked again
    monkeypatch.setenv("OCTAVO_SHIPPED_KERNELS", "0")
    assert kernel_cache.seed_triton_cache(archives, str(tmp_path / "other")) is None
    assert not [p for p in os.listdir(cache) if p.startswith(".octavo-seed-")]  # temporary folder removed


def test_a_truncated_archive_warns_and_starts(tmp_path, monkeypatch, caplog):
    """GPU batch 2 of session 10: an archive rewritten while an engine read it (a truncated .xz) failed the engine's
    start with EOFError. The archive only saves compile time: the engine warns, adds nothing from it, writes no
    marker (a good copy is unpacked next time) and still seeds the good archives."""
    monkeypatch.setattr(kernel_cache, "_triton_version", lambda: "9.9.9")
    archives = _archive(tmp_path, "triton-9.9.9-a.tar.xz", {"AAA": "shipped a"})
    _archive(tmp_path, "triton-9.9.9-b.tar.xz", {"BBB": "shipped b"})
    bad = os.path.join(archives, "triton-9.9.9-b.tar.xz")
    data = open(bad, "rb").read()
    with open(bad, "wb") as f:
        f.write(data[: len(data) // 2])
    cache = tmp_path / "cache"
    with caplog.at_level("WARNING", logger=kernel_cache.logger.name):
        assert kernel_cache.seed_triton_cache(archives, str(cache)) == 1
    assert (cache / "AAA" / "kernel.json").read_text() == "shipped a"
    assert not (cache / "BBB").exists()
    assert "triton-9.9.9-b.tar.xz unreadable" in caplog.text
    assert not [p for p in os.listdir(cache) if "triton-9.9.9-b" in p]  # no marker for the damaged one


@pytest.mark.parametrize("installed", ["9.9.8", None])
def test_other_triton_versions_are_left_alone(tmp_path, monkeypatch, installed):
    monkeypatch.setattr(kernel_cache, "_triton_version", lambda: installed)
    archives = _archive(tmp_path, "triton-9.9.9-sm90.tar.xz", {"AAA": "a"})
    assert kernel_cache.seed_triton_cache(archives, str(tmp_path / "cache")) is None
    assert not (tmp_path / "cache").exists()


def test_shipped_archives_are_well_formed(tmp_path):
    """Every archive in the package unpacks as plain files under one ``triton_cache`` folder of cache entries."""
    archives = sorted(os.listdir(kernel_cache.ARCHIVE_DIR))
    assert archives, f"no shipped archive in {kernel_cache.ARCHIVE_DIR}"  # one ships (triton 3.6.0, cuda:90)
    for name in archives:
        assert name.startswith("triton-") and name.endswith(".tar.xz"), name
        with tarfile.open(os.path.join(kernel_cache.ARCHIVE_DIR, name), "r:xz") as tar:
            members = tar.getmembers()
            assert all(m.name.split("/")[0] == "triton_cache" and (m.isfile() or m.isdir()) for m in members), name
            assert sum(1 for m in members if m.isdir() and m.name.count("/") == 1) > 0, name


def test_the_cuda_platform_seeds_the_shipped_archive(tmp_path, monkeypatch):
    """The worker's call, ``Platform.install_shipped_kernels``, unpacks the archive shipped beside the CUDA plugin
    into Triton's cache (here a temporary folder) for its Triton version, once."""
    from octavo.plugins.platforms.cuda import CudaPlatform

    name = sorted(os.listdir(kernel_cache.ARCHIVE_DIR))[0]
    monkeypatch.setattr(kernel_cache, "_triton_version", lambda: name.split("-")[1])
    monkeypatch.setattr(kernel_cache, "triton_cache_dir", lambda: str(tmp_path / "cache"))
    monkeypatch.delenv("OCTAVO_SHIPPED_KERNELS", raising=False)
    added = CudaPlatform().install_shipped_kernels()
    with tarfile.open(os.path.join(kernel_cache.ARCHIVE_DIR, name), "r:xz") as tar:
        entries = {m.name.split("/")[1] for m in tar.getmembers() if m.name.count("/") == 1 and m.isdir()}
    assert added == len(entries) > 0
    assert entries <= set(os.listdir(tmp_path / "cache"))
    assert CudaPlatform().install_shipped_kernels() == 0  # once
    monkeypatch.setattr(kernel_cache, "_triton_version", lambda: "0.0.0")  # another Triton: nothing to do
    assert CudaPlatform().install_shipped_kernels() is None


def test_shipped_archives_are_package_data():
    """A wheel ships the archives (an editable install reads the source tree and would hide a miss), and no
    package-data glob in pyproject.toml points at a folder that no longer holds its files (a moved module)."""
    import fnmatch
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    repo = Path(__file__).resolve().parents[2]
    data = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    roots = {"octavo.core": "core", "octavo.plugins": "plugins", "octavo": "sdk"}  # setup.py's package_dir
    for package, globs in data.items():
        top = next(r for r in roots if package == r or package.startswith(r + "."))
        folder = repo / roots[top] / package[len(top) + 1:].replace(".", "/")
        for g in globs:
            assert list(folder.glob(g)), f"package-data {package!r}: {g!r} matches nothing in {folder}"
    platforms = Path(kernel_cache.__file__).parent
    for name in os.listdir(kernel_cache.ARCHIVE_DIR):
        rel = (Path(kernel_cache.ARCHIVE_DIR) / name).relative_to(platforms).as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in data["octavo.plugins.platforms"]), rel
