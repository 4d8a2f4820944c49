"""Fixed batch-1 GEMV tiles per weight shape (plugins/platforms/cuda_gemv_table.py): which entry wins, that the
table is keyed by GPU and off on a CPU, that a tile the unmasked kernel path cannot run is refused, and (Triton's
interpreter) that ``cuda_fusions.gemv`` really launches with the fixed tile."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.fixture
def table(monkeypatch):
    from octavo.plugins.platforms import cuda_gemv_table as t

    monkeypatch.setattr(t, "TABLE", {("9.0", 4096, 2048): (4, 2048, 4, 2)})
    monkeypatch.setitem(t._STATE, "cap", {0: "9.0"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    yield t
    t.set_override(None)
    t.set_table(True)


def test_table_entry_by_capability_override_first(table):
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert table.lookup(4096, 2048, cuda) == {"BLOCK_N": 4, "BLOCK_K": 2048, "num_warps": 4, "num_stages": 2}
    assert table.lookup(4096, 2048, cpu) is None  # the table is for GPUs
    assert table.lookup(4096, 4096, cuda) is None  # other shapes: the autotuner
    table._STATE["cap"][0] = "10.0"
    assert table.lookup(4096, 2048, cuda) is None  # measured on sm_90 only
    table.set_override({(4096, 2048): (8, 512, 4, 3)})  # benchmarks: any device, before the table
    assert table.lookup(4096, 2048, cpu)["BLOCK_N"] == 8
    table.set_override(None)
    table._STATE["cap"][0] = "9.0"
    table.set_table(False)
    assert table.lookup(4096, 2048, cuda) is None


def test_tile_that_the_even_path_cannot_run_is_refused(table):
    table.set_override({(4096, 7168): (8, 2048, 8, 2)})  # 7168 % 2048 != 0: unmasked loads would run past K
    with pytest.raises(ValueError, match=r"\(8, 2048, 8, 2\).*\(4096, 7168\)"):
        table.lookup(4096, 7168, torch.device("cpu"))
    table.set_override({(100, 48): (8, 32, 4, 2)})  # ragged shapes run masked: any tile
    assert table.lookup(100, 48, torch.device("cpu"))["BLOCK_K"] == 32


def _interpreted_launches() -> None:
    """(child, TRITON_INTERPRET=1 set before any kernel exists) gemv with and without a fixed tile."""
    from octavo.plugins.platforms import cuda_fusions, cuda_gemv
    from octavo.plugins.platforms.cuda_gemv_table import set_override

    launched = []
    real = cuda_gemv._gemv_kernel  # where gemv looks it up (cuda_fusions re-exports both)

    class Spy:
        def __getitem__(self, grid):
            def run(*args, **kw):
                launched.append((grid, kw["BLOCK_N"], kw["BLOCK_K"]))
                return real[grid](*args, **kw)
            return run

    cuda_gemv._gemv_kernel = Spy()
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(40, 48, generator=gen).to(torch.bfloat16)
    x = torch.randn(1, 48, generator=gen).to(torch.bfloat16)
    set_override({(40, 48): (8, 32, 4, 2)})
    y = cuda_fusions.gemv(x, w)
    assert launched == [((5,), 8, 32)], launched
    assert torch.allclose(y.double(), x.double() @ w.double().t(), rtol=1e-2, atol=1e-2)
    set_override(None)
    cuda_fusions.gemv(x, w)
    assert launched[-1] == ((3,), 16, 64), launched  # back to the interpreter's fixed tile


def test_gemv_launches_with_the_fixed_tile():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


if __name__ == "__main__":
    _interpreted_launches()
