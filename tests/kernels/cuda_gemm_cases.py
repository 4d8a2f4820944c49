"""Cases for the Triton GEMM of decode-step projections (``plugins/platforms/cuda_gemm.py``).

Not collected directly: ``test_cuda_gemm_cpu.py`` runs this file under ``TRITON_INTERPRET=1`` (small shapes,
fp16/fp32: the interpreter cannot make bf16 dots); on a CUDA machine run it directly (``benchmarks/device/nano8.sh``
does): bf16, the Qwen3-0.6B and Llama-3-8B projection shapes at 1-256 rows, every launch of the table and the
sweep. Reference: float64 of the same (rounded) inputs; split-K sums are checked bitwise-deterministic.
"""

from __future__ import annotations

import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("needs CUDA or TRITON_INTERPRET=1 (run through test_cuda_gemm_cpu.py)", allow_module_level=True)

from octavo.plugins.platforms import cuda_gemm  # noqa: E402
from octavo.plugins.platforms.cuda_gemm import GemmConfig, gemm  # noqa: E402
from octavo.plugins.platforms.cuda_pdl import launch_opts  # noqa: E402

DEV = torch.device("cpu" if INTERPRET else "cuda")
DTYPES = (torch.float16, torch.float32) if INTERPRET else (torch.bfloat16,)  # the served dtype (builds are slow)
# (M, N, K): uneven rows and columns, K split in 1-4 parts
SHAPES = ([(5, 48, 128), (70, 40, 256)] if INTERPRET else
          [(1, 1024, 2048), (7, 4096, 1024), (64, 6144, 1024), (206, 1024, 3072), (256, 1024, 2048),
           (206, 6144, 4096), (130, 4096, 14336), (100, 1000, 1024)])
# on CUDA: every launch the committed table uses (else a spread of tiles, splits and TMA)
_TABLES = (cuda_gemm.TABLE, cuda_gemm.LOGITS_TABLE)
_TABLE_CONFIGS = sorted({c for t in _TABLES for rows in t.values() for _, c in rows if c is not None},
                        key=GemmConfig.name)
CONFIGS = ([GemmConfig(16, 16, 32, 1, 4, 2), GemmConfig(32, 16, 16, 4, 4, 1), GemmConfig(16, 16, 32, 2, 4, 2, True)]
           if INTERPRET else _TABLE_CONFIGS or
           [GemmConfig(64, 64, 128, 1, 4, 4), GemmConfig(64, 64, 128, 4, 4, 4), GemmConfig(128, 128, 64, 2, 8, 3),
            GemmConfig(64, 128, 64, 1, 4, 4), GemmConfig(256, 64, 64, 1, 8, 3), GemmConfig(128, 128, 64, 1, 8, 3, True),
            GemmConfig(64, 64, 64, 4, 4, 5, True)])
if not INTERPRET and _TABLE_CONFIGS:  # the tables' own shapes at each row bound, and two ragged ones
    SHAPES = sorted({(7, 4096, 1024), (100, 1000, 1024)} | {(m, n, k) for t in _TABLES for (n, k), rows in t.items()
                                                           for m, c in rows if c is not None})
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}


def _inputs(m, n, k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(dtype)
    return x.to(DEV), w.to(DEV)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=GemmConfig.name)
def test_gemm_matches_float64_and_split_k_is_deterministic(shape, cfg, dtype):
    m, n, k = shape
    if not cfg.fits(k):
        pytest.skip("K does not split into whole tiles")
    x, w = _inputs(m, n, k, dtype, seed=m + n + k)
    got = gemm(x, w, cfg)
    want = (x.double() @ w.double().T).cpu()  # float64 on the device (CPU float64 of the 8B shapes is slow)
    assert got.shape == (m, n) and got.dtype == dtype
    err = float((got.double().cpu() - want).abs().max() / want.abs().max())
    assert err <= TOL[dtype], err  # one rounding of an fp32 sum
    assert torch.equal(gemm(x, w, cfg), got)  # fixed summation order: the same bits every time
    # the PDL launch (first weight tile before gdc_wait; a no-op in the interpreter) computes the same bits
    assert torch.equal(gemm(x, w, cfg, {"PDL": True} if INTERPRET else launch_opts()), got)


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=GemmConfig.name)
def test_float32_output_holds_the_rounded_values(cfg):
    """``out_dtype=float32``: the values of the 16-bit result (each exactly representable), as ``.float()`` of it
    would give, in one pass (split-K rounds in the sum kernel)."""
    x, w = _inputs(9, 48, 512, torch.float16, seed=5)
    got = gemm(x, w, cfg, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    assert torch.equal(got, gemm(x, w, cfg).float())


def test_gemm_writes_into_a_strided_output_and_refuses_bad_inputs():
    x, w = _inputs(9, 32, 64, DTYPES[0], seed=1)
    big = torch.full((9, 48), 7.0, dtype=x.dtype, device=DEV)
    cfg = GemmConfig(16, 16, 32, 2, 4, 2)
    gemm(x, w, cfg, out=big[:, 8:40])
    want = (x.double().cpu() @ w.double().cpu().T)
    assert float((big[:, 8:40].double().cpu() - want).abs().max() / want.abs().max()) <= TOL[x.dtype]
    assert bool((big[:, :8] == 7).all()) and bool((big[:, 40:] == 7).all())  # nothing outside its columns
    with pytest.raises(ValueError, match="multiple of split_k"):
        gemm(x, w, GemmConfig(16, 16, 48, 1, 4, 2))
    with pytest.raises(ValueError, match="share K"):
        gemm(x, w[:, :32], cfg)


def test_lookup_takes_the_first_row_bound_and_only_fitting_launches(monkeypatch):
    a, b = GemmConfig(16, 16, 32, 1, 4, 2), GemmConfig(32, 32, 32, 4, 4, 2)
    monkeypatch.setattr(cuda_gemm, "TABLE", {(64, 256): [(64, a), (256, b)], (64, 96): [(256, b)],
                                             (32, 256): [(8, a), (100, None), (256, b)]})
    monkeypatch.setattr(cuda_gemm, "_INTERPRET_TABLE", True)
    monkeypatch.setattr(cuda_gemm, "MIN_ROWS", 2)
    assert cuda_gemm.lookup(1, 64, 256) is None  # below MIN_ROWS: the GEMV / cuBLAS
    assert cuda_gemm.lookup(2, 64, 256) == a and cuda_gemm.lookup(64, 64, 256) == a
    assert cuda_gemm.lookup(65, 64, 256) == b and cuda_gemm.lookup(257, 64, 256) is None
    assert cuda_gemm.lookup(100, 64, 96) is None  # 96 is not 4 x 32
    assert cuda_gemm.lookup(100, 48, 256) is None  # shape not in the table
    assert cuda_gemm.lookup(8, 32, 256) == a and cuda_gemm.lookup(9, 32, 256) is None  # None: cuBLAS there
    assert cuda_gemm.lookup(101, 32, 256) == b


def test_linear_routes_table_shapes_checks_the_first_use_and_drops_a_wrong_launch(monkeypatch, caplog):
    """``cuda_gemm.linear`` (the dense linear method's multi-row path): a listed shape runs the table's launch,
    an unlisted one or a switched-off GEMM returns None (cuBLAS); a launch that disagrees with ``F.linear`` on
    its first use is dropped for good (warning), never returned."""
    import torch.nn.functional as F

    cfg = CONFIGS[0]
    x, w = _inputs(24, 64, 256, DTYPES[0], seed=3)
    monkeypatch.setattr(cuda_gemm, "TABLE", {(64, 256): [(256, cfg)]})
    monkeypatch.setattr(cuda_gemm, "_INTERPRET_TABLE", True)
    monkeypatch.setattr(cuda_gemm, "_STATE", {"on": True, "checked": {}})
    y = cuda_gemm.linear(x, w)
    assert y is not None and torch.equal(y, gemm(x, w, cfg))
    err = float((y.double() - F.linear(x, w).double()).abs().max() / F.linear(x, w).double().abs().max())
    assert err <= TOL[x.dtype]
    assert cuda_gemm.linear(x[:, :128].contiguous(), w[:, :128].contiguous()) is None  # (64, 128) not listed
    assert cuda_gemm.linear(x[:1], w) is None  # one row: the GEMV's
    cuda_gemm.set_triton_gemm(False)
    assert cuda_gemm.linear(x, w) is None
    cuda_gemm.set_triton_gemm(True)
    # a wrong launch (here: a kernel that drops the last K tile) is caught on first use and never used
    monkeypatch.setattr(cuda_gemm, "_STATE", {"on": True, "checked": {}})
    real = cuda_gemm.gemm
    monkeypatch.setattr(cuda_gemm, "gemm", lambda x, w, c, pdl=None, out=None: real(x[:, :224].contiguous(),
                                                                                   w[:, :224].contiguous(),
                                                                                   GemmConfig(16, 16, 32, 1, 4, 2)))
    with caplog.at_level("WARNING"):
        assert cuda_gemm.linear(x, w) is None
        assert cuda_gemm.linear(x, w) is None
    assert "not used" in caplog.text
    # a launch that cannot run (e.g. out of shared memory on this card) falls back too, and a dtype mismatch
    monkeypatch.setattr(cuda_gemm, "_STATE", {"on": True, "checked": {}})
    monkeypatch.setattr(cuda_gemm, "gemm", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("out of resource")))
    assert cuda_gemm.linear(x, w) is None and "out of resource" in caplog.text
    assert cuda_gemm.linear(x.float(), w) is None


def test_blas_table_picks_the_library_per_row_bound_and_routes_through_cublaslt(monkeypatch):
    """``BLAS_TABLE``: the first row bound >= M names the library (None: cuBLAS); on CUDA, ``linear`` runs a listed
    shape and row count through cuBLASLt (within the check of ``F.linear``), and the Triton table wins over it."""
    import torch.nn.functional as F

    monkeypatch.setattr(cuda_gemm, "BLAS_TABLE", {(64, 256): [(88, None), (96, "cublaslt"), (208, None),
                                                              (224, "cublaslt")]})
    monkeypatch.setattr(cuda_gemm, "TABLE", {})
    monkeypatch.setattr(cuda_gemm, "_STATE", {"on": True, "checked": {}})
    assert cuda_gemm.blas_library(16, 64, 256) is None  # below MIN_ROWS
    assert [cuda_gemm.blas_library(m, 64, 256) for m in (24, 88, 89, 96, 104, 208, 216, 224, 232)] == \
        [None, None, "cublaslt", "cublaslt", None, None, "cublaslt", "cublaslt", None]
    assert cuda_gemm.blas_library(96, 64, 128) is None  # shape not listed
    x, w = _inputs(96, 64, 256, DTYPES[0], seed=5)
    before = torch.backends.cuda.preferred_blas_library()
    y = cuda_gemm.linear(x, w)
    if INTERPRET:  # no cuBLAS: the caller's F.linear
        assert y is None
        return
    assert y is not None and (64, 256, "cublaslt", x.dtype) in cuda_gemm._STATE["checked"]
    want = F.linear(x, w).double()
    assert float((y.double() - want).abs().max() / want.abs().max()) <= TOL[x.dtype]
    assert torch.backends.cuda.preferred_blas_library() == before  # restored
    assert cuda_gemm.linear(x[:88], w) is None  # None: cuBLAS at that bound
    cfg = _TABLE_CONFIGS[0] if _TABLE_CONFIGS else GemmConfig(64, 64, 128, 1, 4, 4)
    monkeypatch.setattr(cuda_gemm, "TABLE", {(64, 256): [(256, cfg)]} if cfg.fits(256) else {})
    if cfg.fits(256):
        assert torch.equal(cuda_gemm.linear(x, w), gemm(x, w, cfg, launch_opts()))


def test_logits_method_writes_rounded_float32_logits_and_installs_only_where_listed(monkeypatch):
    """``LogitsMethod`` on a real ``ParallelLMHead``: table shape -> float32 logits equal to the 16-bit GEMM's
    values (``compute_logits``' ``.float()`` then copies nothing); other row counts -> ``F.linear`` (16-bit, as
    before); ``install_logits`` skips heads with a bias or a shape the table lacks."""
    from octavo.nn.embedding import ParallelLMHead

    head = ParallelLMHead(96, 256).to(DEV)
    _, w = _inputs(1, 96, 256, DTYPES[0], seed=7)
    head.weight.data = w
    x, _ = _inputs(20, 96, 256, DTYPES[0], seed=8)
    cfg = CONFIGS[0]
    monkeypatch.setattr(cuda_gemm, "LOGITS_TABLE", {(96, 256): [(32, cfg)]})
    monkeypatch.setattr(cuda_gemm, "TABLE", {})
    monkeypatch.setattr(cuda_gemm, "MIN_ROWS", 2)
    monkeypatch.setattr(cuda_gemm, "_INTERPRET_TABLE", True)
    monkeypatch.setattr(cuda_gemm, "_STATE", {"on": True, "checked": {}})
    assert cuda_gemm.install_logits(head) == {"LMHead(gemm)": 1}
    logits = head.compute_logits(x)
    assert logits.dtype == torch.float32 and torch.equal(logits, gemm(x, w, cfg).float())
    wide = torch.cat([x, x])  # 40 rows: not in the table -> F.linear, as without the method
    assert torch.equal(head.compute_logits(wide), torch.nn.functional.linear(wide, w).float())
    other = ParallelLMHead(96, 128).to(DEV)
    assert cuda_gemm.install_logits(other) == {}


def _silu_table_configs():
    from octavo.plugins.platforms import cuda_gemm_silu

    return sorted({c for rows in cuda_gemm_silu.TABLE.values() for _, c in rows if c is not None}, key=GemmConfig.name)


SILU_CFGS = ([GemmConfig(16, 16, 32, 1, 4, 2)] if INTERPRET else
             _silu_table_configs() or [GemmConfig(64, 64, 128, 1, 4, 3), GemmConfig(128, 64, 64, 1, 8, 3)])


def _unfused_silu(x, w):
    """The unfused MLP's arithmetic: gate/up GEMM rounded to the dtype, SiLU rounded, product rounded."""
    y = (x.double() @ w.double().T).to(x.dtype).float()
    g, u = y.chunk(2, -1)
    s = (g / (1.0 + torch.exp(-g))).to(x.dtype).float()
    return (s * u).to(x.dtype)


@pytest.mark.parametrize("cfg", SILU_CFGS, ids=GemmConfig.name)
@pytest.mark.parametrize("m,i,k", [(5, 32, 64), (70, 48, 256)] if INTERPRET else [(206, 3072, 1024), (64, 14336, 4096)])
def test_gate_up_silu_matches_the_unfused_arithmetic(m, i, k, cfg):
    from octavo.plugins.platforms.cuda_gemm_silu import gemm_silu

    if i % cfg.bn or k % cfg.bk:
        pytest.skip("shape does not tile")
    x, w = _inputs(m, 2 * i, k, DTYPES[0], seed=m + i)
    got = gemm_silu(x, w, cfg)
    want = _unfused_silu(x.cpu(), w.cpu())
    assert got.shape == (m, i) and got.dtype == x.dtype
    err = float((got.cpu().double() - want.double()).abs().max() / want.double().abs().max())
    assert err <= 2 * TOL[x.dtype], err  # float64 GEMM vs fp32 sums: the roundings may land one step apart
    assert torch.equal(gemm_silu(x, w, cfg, {"PDL": True} if INTERPRET else launch_opts()), got)


def test_gate_up_silu_routes_table_shapes_and_drops_a_disagreeing_launch(monkeypatch, caplog):
    from octavo.plugins.platforms import cuda_gemm_silu as gs

    cfg = SILU_CFGS[0]
    n, k = 2 * max(32, cfg.bn), max(128, cfg.bk)  # a weight shape the tile divides (I of bn, K of bk)
    x, w = _inputs(24, n, k, DTYPES[0], seed=9)
    monkeypatch.setattr(gs, "TABLE", {(n, k): [(32, cfg)]})
    monkeypatch.setattr(gs, "_INTERPRET_TABLE", True)
    monkeypatch.setattr(gs, "_CHECKED", {})
    monkeypatch.setattr(cuda_gemm, "_STATE", {"on": True, "checked": {}})
    y = gs.gate_up_silu(x, w, lambda t: _unfused_silu(t, w))
    assert y is not None and torch.equal(y, gs.gemm_silu(x, w, cfg))
    assert gs.gate_up_silu(torch.cat([x, x]), w, lambda t: _unfused_silu(t, w)) is None  # 48 rows: not listed
    monkeypatch.setattr(gs, "_CHECKED", {})
    with caplog.at_level("WARNING"):  # an "unfused" path that differs: the fused launch is never used
        assert gs.gate_up_silu(x, w, lambda t: _unfused_silu(t, w) * 2) is None
    assert "not used" in caplog.text


@torch.inference_mode()
def test_llama_mlp_runs_the_fused_gate_up_for_listed_row_counts(monkeypatch):
    """Through cuda_mlp_fusion's installed MLP forward: 3 rows of a listed shape take the fused launch (result
    within the unfused path's rounding), 1 row the batch-1 GEMV, an unlisted row count the original forward."""
    import types

    from octavo.plugins.models.llama import LlamaMLP
    from octavo.plugins.platforms import cuda_fusions as cf
    from octavo.plugins.platforms import cuda_gemm_silu as gs
    from octavo.plugins.platforms import cuda_mlp_fusion as cmf

    dt = DTYPES[0]
    m = LlamaMLP(types.SimpleNamespace(hidden_size=64, intermediate_size=48, hidden_act="silu", mlp_bias=False))
    g = torch.Generator().manual_seed(3)
    for p in m.parameters():
        p.data = (torch.randn(p.shape, generator=g) * 0.1).to(dt).to(DEV)
    m.gate_up_proj.quant_method = cf._gemv_linear_method()
    m.down_proj.quant_method = cf._gemv_linear_method()
    m.act_fn.forward = types.MethodType(cf._fused_silu_forward, m.act_fn)
    x3 = torch.randn(3, 64, generator=g).to(dt).to(DEV)
    want3 = m(x3)
    cfg = SILU_CFGS[0] if INTERPRET else GemmConfig(64, 16, 64, 1, 4, 2)
    monkeypatch.setattr(gs, "TABLE", {(96, 64): [(4, cfg)]})
    monkeypatch.setattr(gs, "_INTERPRET_TABLE", True)
    monkeypatch.setattr(gs, "_CHECKED", {})
    monkeypatch.setattr(cuda_gemm, "_STATE", {"on": True, "checked": {}})
    assert cmf.fuse_silu_gemv(m, dt, DEV, cf._close) == {"MLP(gemv+silu)": 1}
    calls = []
    monkeypatch.setattr(gs, "gemm_silu", lambda *a, _o=gs.gemm_silu: calls.append(1) or _o(*a))
    got3 = m(x3)
    assert calls, "the fused gate/up + SiLU launch did not run"
    err = float((got3.double() - want3.double()).abs().max() / want3.double().abs().max())
    assert err <= 2 * TOL[dt], err
    n = len(calls)
    x5 = torch.randn(5, 64, generator=g).to(dt).to(DEV)  # 5 rows: above the table's bound -> original forward
    m(x5)
    assert len(calls) == n
