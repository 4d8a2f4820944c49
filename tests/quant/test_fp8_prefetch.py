"""The one-row fp8 GEMV's L2 prefetch chain and programmatic dependent launch (plugins/quant/fp8_prefetch.py).

CPU: the switches are validated, the chain follows the forward order, the prefetch split covers exactly the
asked bytes, refusals (several rows, the interpreter), and the kernels compiled for sm_90 (Triton's own
compiler, no GPU needed) hold ``cp.async.bulk.prefetch.L2`` / ``griddepcontrol`` exactly when asked. GPU-marked:
the GEMV with prefetch and PDL gives the same bits as without, eager and replayed from a CUDA graph right
after a producer that lets it launch early (the read-after-write race PDL must not open).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")


def test_prefetch_switch_is_validated(monkeypatch):
    from octavo.plugins.quant import fp8_prefetch

    monkeypatch.setenv("OCTAVO_FP8_GEMV_PREFETCH_MB", "24")
    assert fp8_prefetch._prefetch_mb() == 24
    monkeypatch.delenv("OCTAVO_FP8_GEMV_PREFETCH_MB")
    assert fp8_prefetch._prefetch_mb() == fp8_prefetch.DEFAULT_PREFETCH_MB
    for bad in ("x", "-1", "49", "1.5"):
        monkeypatch.setenv("OCTAVO_FP8_GEMV_PREFETCH_MB", bad)
        with pytest.raises(ValueError, match="OCTAVO_FP8_GEMV_PREFETCH_MB"):
            fp8_prefetch._prefetch_mb()


def test_chain_follows_forward_order_and_cpu_gets_nothing():
    from types import SimpleNamespace

    from octavo.plugins.quant import fp8_prefetch

    layers = [SimpleNamespace(weight=torch.zeros(2), quant_method=SimpleNamespace()) for _ in range(3)]
    assert fp8_prefetch.link_chain([layers[0], layers[1], layers[0], layers[2]]) == 2  # a repeat: first call
    assert layers[0].quant_method.pf_next is layers[1].weight
    assert layers[1].quant_method.pf_next is layers[2].weight
    assert not hasattr(layers[2].quant_method, "pf_next")
    old = fp8_prefetch.PREFETCH_MB, fp8_prefetch.PDL
    try:
        fp8_prefetch.PREFETCH_MB, fp8_prefetch.PDL = 16, True
        assert fp8_prefetch.gemv_launch(layers[0].quant_method, torch.device("cpu")) == {}
    finally:
        fp8_prefetch.PREFETCH_MB, fp8_prefetch.PDL = old


@pytest.mark.parametrize("numel,nbytes", [(4096 * 4096, 16 << 20), (6144 * 4096, 16 << 20), (1000, 1 << 20),
                                          (100_003, 50_000), (8, 1 << 20)])
def test_prefetch_split_covers_the_asked_bytes(numel, nbytes):
    from octavo.plugins.quant.fp8_gemv_l2 import PF_PIECES, PF_PROGS, prefetch_args

    t = torch.empty(numel, dtype=torch.uint8)
    _, total, piece = prefetch_args(t, nbytes)
    want = min(nbytes, numel) // 16 * 16
    if want < 16:
        assert total == 0
        return
    assert total == want and piece % 16 == 0 and piece > 0
    slots = PF_PROGS.value * PF_PIECES.value
    assert slots * piece >= total and (piece == 16 or slots * (piece - 16) < total)  # the smallest covering piece
    assert prefetch_args(t[1:], nbytes)[1] == 0  # not 16-byte aligned: no prefetch


def test_prefetch_and_pdl_refused_where_they_cannot_run(monkeypatch):
    from octavo.plugins.quant import fp8_prefetch
    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from octavo.plugins.quant.fp8_gemv import fp8_gemv

    w, ws = quantize_fp8_rows(torch.randn(32, 64))
    for bad in (5, -1):
        with pytest.raises(ValueError, match="pdl_w"):
            fp8_gemv(torch.randn(1, 64).bfloat16(), w, ws, pdl=True, pdl_w=bad)
    for bad in (1, 3, 8):
        with pytest.raises(ValueError, match="loop2"):
            fp8_gemv(torch.randn(1, 64).bfloat16(), w, ws, loop2=bad)
    for bad in ("0", "5", "x"):
        monkeypatch.setenv("OCTAVO_FP8_GEMV_PDL_W_BLOCKS", bad)
        with pytest.raises(ValueError, match="OCTAVO_FP8_GEMV_PDL_W_BLOCKS"):
            fp8_prefetch._pdl_w_blocks()
    monkeypatch.setenv("OCTAVO_FP8_GEMV_PDL_W_BLOCKS", "3")
    assert fp8_prefetch._pdl_w_blocks() == 3
    monkeypatch.delenv("OCTAVO_FP8_GEMV_PDL_W_BLOCKS")
    with pytest.raises(ValueError, match="one-row"):
        fp8_gemv(torch.randn(2, 64).bfloat16(), w, ws, pdl=True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="interpreter"):
        fp8_gemv(torch.randn(1, 64).bfloat16(), w, ws, prefetch=(w, 1024))


def _ptx(fn, signature: dict, constexprs: dict) -> str:
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget

    # the kernel's other constexpr options at their defaults (an option added later is off here)
    params = inspect.signature(fn.fn).parameters.values()
    constexprs = {**{p.name: p.default for p in params if p.name not in signature and p.name not in constexprs
                     and p.default is not inspect.Parameter.empty}, **constexprs}
    src = triton.compiler.ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}},
                                    constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


@pytest.mark.parametrize("prefetch,pdl,self_pf,pdl_w", [(True, True, False, False), (False, False, False, False),
                                                        (False, False, True, False), (False, True, False, True),
                                                        (False, True, False, 4)])
def test_sm90_ptx_has_the_instructions_exactly_when_asked(prefetch, pdl, self_pf, pdl_w):
    from octavo.plugins.quant.fp8_fused import _rms_norm_quant_kernel
    from octavo.plugins.quant.fp8_gemv import _fp8_gemv_kernel

    sig = {"x_ptr": "*bf16", "xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "b_ptr": "*bf16",
           "y_ptr": "*bf16", "pf_ptr": "*fp8e4nv", "pf_total": "i64", "pf_piece": "i64", "M": "i32", "N": "i32",
           "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32"}
    flags = dict(QUANT_X=True, PRE_Q=False, HAS_BIAS=False, EVEN=True, SOFT_FP8=False, BLOCK_N=16, BLOCK_K=512,
                 PREFETCH=prefetch, USE_PDL=pdl, SELF_PF=self_pf, W_BITS=False, REG_PF=False, ACC_SPLIT=0, X2D=False,
                 AMAX_KP=0, LOOP2=0)
    ptx = _ptx(_fp8_gemv_kernel, sig, dict(flags, PDL_W=pdl_w))
    assert ptx.count("cp.async.bulk.prefetch.L2.global") >= prefetch + self_pf
    assert ("cp.async.bulk.prefetch.L2.global" in ptx) == (prefetch or self_pf)
    if self_pf:  # one request a row (16), each from thread 0 only: before session 16 every row was asked by each
        assert ptx.count("setp.eq.u32 p, t, 0") == 16  # thread that held a copy of its address (16-32 of them)
    assert ("griddepcontrol.wait" in ptx) == pdl
    assert ("griddepcontrol.launch_dependents" in ptx) == bool(pdl_w)  # pdl_w: the GEMV's dependents launch early
    if pdl_w:  # the first pdl_w weight blocks are asked for before the wait: more loads there with more blocks
        assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait")
    if pdl_w > 1:  # each block before the wait adds the loads of one block there
        def before(blocks):
            text = _ptx(_fp8_gemv_kernel, sig, dict(flags, PDL_W=blocks)) if blocks != pdl_w else ptx
            return text[:text.index("griddepcontrol.wait")].count("ld.global")

        one, none = before(1), before(0)
        assert one > none and before(pdl_w) - none == pdl_w * (one - none)
    norm_sig = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "res_out_ptr": "*bf16",
                "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "stride_x": "i32", "stride_r": "i32", "n_cols": "i32",
                "eps": "fp32"}
    ptx = _ptx(_rms_norm_quant_kernel, norm_sig, dict(HAS_RES=True, SOFT_FP8=False, BLOCK=4096, TRIGGER=pdl,
                                                      WAIT=pdl_w, W_FIRST=0))
    assert ("griddepcontrol.launch_dependents" in ptx) == pdl
    assert ("griddepcontrol.wait" in ptx) == bool(pdl_w)  # the norm under PDL waits before its first load
    if pdl_w:
        assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")


# ---------------------------------------------------------------------------------------------- GPU
def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (sm_90+)")
@pytest.mark.parametrize("n,k", [(4096, 4096), (6144, 4096), (4096, 14336)])
def test_prefetch_and_pdl_same_bits_in_a_graph_after_an_early_trigger(n, k):
    from octavo.plugins.quant import fp8_prefetch
    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from octavo.plugins.quant.fp8_fused import rms_norm_quant
    from octavo.plugins.quant.fp8_gemv import fp8_gemv
    from tests.quant.fp8_inputs import assert_graph_replays_match

    gen = torch.Generator(device="cuda").manual_seed(0)
    w, ws = quantize_fp8_rows(torch.randn(n, k, device="cuda", generator=gen) * 0.02)
    nxt = torch.empty(28672 * 4096, dtype=torch.uint8, device="cuda")  # the "next weight" to prefetch
    norm_w = (1 + 0.1 * torch.randn(k, device="cuda", generator=gen)).bfloat16()
    x = torch.zeros(1, k, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(6, 1, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 3
    cfg = (16, 512, 4)

    def block(cfg=cfg, **kw):  # a producer (the quantizing norm, which triggers early under PDL) before each GEMV
        h, _, q, s = rms_norm_quant(x, norm_w, 1e-5)
        return (fp8_gemv(q, w, ws, x_scale=s, out_dtype=torch.bfloat16, config=cfg, **kw),
                fp8_gemv(h, w, ws, config=cfg, **kw))

    def plain():
        fp8_prefetch.PDL = False  # the norm does not trigger early either
        try:
            return block()
        finally:
            fp8_prefetch.PDL = True

    old = fp8_prefetch.PDL
    try:
        with torch.inference_mode():
            x.copy_(src[0])
            want = block()
            fp8_prefetch.PDL = True
            for kw in ({"prefetch": (nxt, 16 << 20)}, {"pdl": True}, {"self_prefetch": True},
                       {"prefetch": (nxt, 16 << 20), "pdl": True, "self_prefetch": True}, {"pdl": True, "pdl_w": True}):
                for got, ref in zip(block(**kw), want):
                    assert torch.equal(got, ref), kw
            combos = ((True, 0), (2, 0), (4, 0), (True, 2), (3, 2), (True, 4))
            for tile, pairs in (((16, 1024, 8, 3), combos), ((4, 1024, 4, 3), combos), ((8, 1024, 8, 3), combos[-1:])):
                base = block(cfg=tile)  # the H100 table's tiles (and the 4-block loop's other): blocks before the wait
                for blocks, loop2 in pairs:
                    for got, ref in zip(block(cfg=tile, pdl=True, pdl_w=blocks, loop2=loop2), base):
                        assert torch.equal(got, ref), (tile, blocks, loop2)
            assert_graph_replays_match(lambda: block(cfg=(16, 1024, 8, 3), pdl=True, pdl_w=4),
                                       lambda: (plain(), block(cfg=(16, 1024, 8, 3)))[1], x, src)
            assert_graph_replays_match(lambda: block(prefetch=(nxt, 16 << 20), pdl=True, self_prefetch=True), plain,
                                       x, src)
            assert_graph_replays_match(lambda: block(pdl=True, pdl_w=True), plain, x, src)
    finally:
        fp8_prefetch.PDL = old


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (sm_90+)")
def test_norm_under_pdl_reads_the_gemv_before_it():
    """The quantizing norm launched as a programmatic dependent launch (fp8_fused.NORM_PDL) reads the output of the
    GEMV right before it: the same bits as the norm launched after it, eager and replayed (a missing wait would
    read a stale or half-written row)."""
    from octavo.plugins.quant import fp8_fused
    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from octavo.plugins.quant.fp8_fused import rms_norm_quant
    from octavo.plugins.quant.fp8_gemv import fp8_gemv
    from tests.quant.fp8_inputs import assert_graph_replays_match

    gen = torch.Generator(device="cuda").manual_seed(1)
    k = 4096
    w_o, ws_o = quantize_fp8_rows(torch.randn(k, k, device="cuda", generator=gen) * 0.02)
    w_q, ws_q = quantize_fp8_rows(torch.randn(6144, k, device="cuda", generator=gen) * 0.02)
    norm_w = (1 + 0.1 * torch.randn(k, device="cuda", generator=gen)).bfloat16()
    x = torch.zeros(1, k, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(6, 1, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 3

    def chain():  # norm -> o-like GEMV -> residual norm of its output -> qkv-like GEMV, as in a layer
        _, _, q, s = rms_norm_quant(x, norm_w, 1e-5)
        y = fp8_gemv(q, w_o, ws_o, x_scale=s, out_dtype=torch.bfloat16, config=(16, 1024, 8, 3), pdl=True,
                     pdl_w=True)
        h, r, q2, s2 = rms_norm_quant(y, norm_w, 1e-5, residual=x)
        z = fp8_gemv(q2, w_q, ws_q, x_scale=s2, out_dtype=torch.bfloat16, config=(4, 1024, 4, 3), pdl=True,
                     pdl_w=True)
        return y, h, r, q2, s2, z

    def plain():
        fp8_fused.NORM_PDL = False
        try:
            return chain()
        finally:
            fp8_fused.NORM_PDL = True

    old = fp8_fused.NORM_PDL
    try:
        with torch.inference_mode():
            x.copy_(src[0])
            want = plain()
            fp8_fused.NORM_PDL = True
            for got, ref in zip(chain(), want):
                assert torch.equal(got, ref)
            assert_graph_replays_match(chain, plain, x, src)
    finally:
        fp8_fused.NORM_PDL = old


@pytest.mark.parametrize("amax_kp,loop2,pdl_w", [(16384, 2, 1), (4096, 4, 2), (0, 4, 4)])
def test_sm90_one_row_options_compile_together(amax_kp, loop2, pdl_w):
    """The one-row kernel's options compile for sm_90 in combination (CPU: Triton's own compiler). Session 12's
    batch 1 lost its absmax measures to a variable of the absmax loop carried into the main loop, which the
    interpreter does not check."""
    from octavo.plugins.quant.fp8_gemv import _fp8_gemv_kernel

    sig = {"x_ptr": "*bf16", "xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "b_ptr": "*bf16",
           "y_ptr": "*bf16", "pf_ptr": "*fp8e4nv", "pf_total": "i64", "pf_piece": "i64", "M": "i32", "N": "i32",
           "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32"}
    ptx = _ptx(_fp8_gemv_kernel, sig, dict(QUANT_X=True, PRE_Q=False, HAS_BIAS=False, EVEN=True, SOFT_FP8=False,
                                           BLOCK_N=16, BLOCK_K=1024, PREFETCH=False, USE_PDL=pdl_w > 0, SELF_PF=False,
                                           W_BITS=False, REG_PF=False, ACC_SPLIT=16, X2D=False, PDL_W=pdl_w,
                                           AMAX_KP=amax_kp, LOOP2=loop2))
    assert "ld.global" in ptx
