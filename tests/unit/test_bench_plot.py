"""``octavo bench`` plots: a PNG beside each JSON result (octavo vs the peer), and a clear message, not a
crash, when matplotlib is missing. Drawn from the repository's recorded results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from octavo.cli import bench_serve, bench_throughput
from octavo.cli.bench_plot import load_runs, png_beside

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_serve_plot_overlays_the_peer(tmp_path):
    runs = load_runs([str(RESULTS / "serve_cpu.json")])
    assert "llama-server" in [r["label"] for r in runs]
    out = tmp_path / "serve.png"
    assert bench_serve.plot(runs, str(out)) is True
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 10_000


def test_throughput_plot_with_and_without_the_peer(tmp_path):
    results = json.loads((RESULTS / "cpu_throughput.json").read_text())["results"]
    both, alone = tmp_path / "both.png", tmp_path / "alone.png"
    assert bench_throughput.plot(results, str(both))
    only_octavo = {d: {"octavo": r["octavo"]} for d, r in results.items()}  # --skip-transformers
    assert bench_throughput.plot(only_octavo, str(alone))
    assert both.read_bytes()[:8] == PNG_MAGIC and alone.read_bytes()[:8] == PNG_MAGIC


def test_png_beside_and_bad_compare_file(tmp_path):
    assert png_beside("results/x.json") == str(Path("results/x.png"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not an `octavo bench serve` result"):
        load_runs([str(bad)])


def test_without_matplotlib_says_why(tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "serve.png"
    assert bench_serve.plot(load_runs([str(RESULTS / "serve_cpu.json")]), str(out)) is False
    assert not out.exists()
    assert "matplotlib is not installed" in capsys.readouterr().err
