"""cuBLASLt's heuristic candidates on CUDA (``plugins/platforms/cuda_gemm_lt.py``): every candidate returned for a
decode-step shape runs, agrees with float64 within bf16 rounding, gives the same bits on every run and inside a CUDA
graph, and ``cuda_gemm.linear`` runs a tabled candidate (found again by its attributes) after its first-use check."""

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch


def test_every_candidate_runs_exact_and_repeatable(cuda):
    torch = cuda
    from octavo.plugins.platforms.cuda_gemm_lt import LtGemm, describe

    gen = torch.Generator(device="cuda").manual_seed(0)
    M, N, K = 96, 1024, 2048
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen) * K ** -0.5
    want = x.double() @ w.double().T
    g = LtGemm()
    cands = g.algos(M, N, K, torch.bfloat16, 16)
    assert cands, "the heuristic returned no candidate"
    for algo, _ws, _waves in cands:
        cfg = describe(algo)
        assert isinstance(cfg["algo"], int) and isinstance(cfg["tile"], int)
        y = g.matmul(x, w, algo)
        assert float((y.double() - want).abs().max() / want.abs().max()) <= 1e-2, cfg
        assert torch.equal(y, g.matmul(x, w, algo)), cfg
        out = torch.empty_like(y)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g.matmul(x, w, algo, out=out)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, y), cfg


def test_linear_runs_a_tabled_candidate(cuda, monkeypatch):
    torch = cuda
    from octavo.plugins.platforms import cuda_gemm
    from octavo.plugins.platforms import cuda_gemm_lt as lt

    M, N, K = 96, 1024, 2048
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen) * K ** -0.5
    algo = lt._gemm().algos(M, N, K, torch.bfloat16, lt.COUNT)[-1][0]
    cfg = lt.describe(algo)
    monkeypatch.setattr(lt, "LT_TABLE", {(torch.cuda.get_device_name(), N, K): {96: cfg}})
    monkeypatch.setattr(cuda_gemm, "TABLE", {})
    monkeypatch.setattr(cuda_gemm, "BLAS_TABLE", {})
    monkeypatch.setattr(cuda_gemm, "_STATE", {"on": True, "checked": {}})
    y = cuda_gemm.linear(x, w)
    assert y is not None and cuda_gemm._STATE["checked"][(N, K, "lt", lt.config_key(cfg), torch.bfloat16)]
    assert torch.equal(y, lt._gemm().matmul(x, w, algo))
    assert cuda_gemm.linear(x[:88], w) is None  # a size not listed: cuBLAS


def test_the_h100_table_picks_are_offered_and_run(cuda):
    """Every config of ``LT_TABLE`` for this card is found among the heuristic's candidates at its size and agrees
    with ``F.linear`` within bf16 rounding (skips on a card the table does not list)."""
    torch = cuda
    import torch.nn.functional as F

    from octavo.plugins.platforms import cuda_gemm_lt as lt

    name = torch.cuda.get_device_name()
    mine = {key: sizes for key, sizes in lt.LT_TABLE.items() if key[0] == name}
    if not mine:
        pytest.skip(f"LT_TABLE lists nothing for {name}")
    gen = torch.Generator(device="cuda").manual_seed(2)
    for (_, N, K), sizes in mine.items():
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen) * K ** -0.5
        for M, cfg in sizes.items():
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
            algo = lt.usable(x, w, cfg)
            assert algo is not None, (N, K, M, cfg)
            y, want = lt.linear(x, w, algo), F.linear(x, w)
            assert float((y.float() - want.float()).abs().max() / want.float().abs().max()) <= 1.6e-2
