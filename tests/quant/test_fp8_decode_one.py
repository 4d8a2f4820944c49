"""The one-launch batch-1 decode on an e4m3 cache (plugins/attention/_fp8_kv_decode_bs1.py): KV write + split-KV
attention + in-kernel merge.

Checked against (1) the KV-write kernel: the cache bytes it stores for the new token are the same bytes, and (2) a
float64 softmax attention over the dequantized cache as the KV-write kernel leaves it (bf16 output and fp16 dots:
1e-2 of the largest output). Contexts of one key, within one split, across several tiles and splits; every launch
twice in a row (the per-head tickets must be back at 0 for the next launch, as in a replayed CUDA graph), the second
time with ``early_io`` (slot before the wait, q / k / v in one round trip: the same output bits). Through
the ``triton`` backend: ``OCTAVO_FP8_DECODE_ONE=1`` vs ``0`` on a decode step of one request give the same cache
bytes and outputs within 1e-2, steps of more rows never take it, and malformed values are refused.
TRITON_INTERPRET=1 in a subprocess on CPU (Triton's conversion, deq 0); the same script runs compiled under the
``gpu`` marker with the Llama-3-8B heads, deq 3 (the engine's conversion), PDL on a Hopper GPU, and a CUDA graph
(``early_io``) replayed at other lengths.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.quant.fp8_inputs import needs_cuda

SCRIPT = r"""
import os
import torch
from octavo.nn.kv_quant import dequantize
from octavo.plugins.attention._fp8_kv_decode_bs1 import fp8_decode_one, one_launch
from octavo.plugins.attention._triton_kernels import _kv_write_kernel
from tests.quant.fp8_attn_cases import paged_case, reference

PAGE = 16
E4M3 = torch.float8_e4m3fn
DEV = torch.device(os.environ.get("DECODE_TEST_DEVICE", "cpu"))
# the engine's launch on a Hopper GPU: PDL (the kernel reads length, table, first tile, with EARLY_IO the slot, before
# its wait)
PDL = ({"PDL": True, "launch_pdl": True} if DEV.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0)
       else None)
gen = torch.Generator().manual_seed(0)


def check(heads, kv, d, L, splits, block_n, deq, ks=0.5, vs=0.25):
    q, kc, vc, _, _, bt, tables = paged_case(gen, heads, kv, d, [L], E4M3, torch.bfloat16, ks, vs, PAGE)
    kn = (torch.randn(1, kv, d, generator=gen) * 2).to(torch.bfloat16)
    vn = torch.randn(1, kv, d, generator=gen).to(torch.bfloat16)
    kn[0, 0, :3] = torch.tensor([1e4, -1e-4, 0.0])  # saturates at 448 * ks, an e4m3 subnormal, zero
    pos = L - 1
    slot = torch.tensor([tables[0][pos // PAGE] * PAGE + pos % PAGE])
    cache = torch.stack([kc, vc]).to(DEV)  # the KV-write kernel's bytes: the reference
    _kv_write_kernel[(1,)](kn.to(DEV), vn.to(DEV), cache, slot.to(DEV), kn.stride(0), kn.stride(1), vn.stride(0),
                           vn.stride(1), cache.stride(0), kv, ks, vs, HEAD_D=d, BLOCK_H=max(2, kv), BLOCK_D=d,
                           KV_FP8=True, FP8_MAX=448.0)
    want = reference(q, dequantize(cache[0].cpu(), ks, torch.float64), dequantize(cache[1].cpu(), vs, torch.float64),
                     tables, [L], d ** -0.5)
    k2, v2 = kc.to(DEV), vc.to(DEV)
    outs = []
    for rep in range(2):  # the second launch finds the tickets reset by the first; it reads the slot and the new
        out = torch.full((1, heads, d), float("nan"), dtype=torch.bfloat16, device=DEV)  # k / v early (EARLY_IO)
        fp8_decode_one(q.to(DEV), kn.to(DEV), vn.to(DEV), k2, v2, bt[0].to(DEV),
                       torch.tensor([L], dtype=torch.int32, device=DEV), slot.to(DEV), out, scale=d ** -0.5 * ks,
                       k_scale=ks, v_scale=vs, splits=splits, block_n=block_n, deq=deq, early_io=rep == 1,
                       pdl=PDL)
        outs.append(out)
        assert torch.equal(k2.view(torch.uint8).cpu(), cache[0].view(torch.uint8).cpu()), (L, splits, "K bytes")
        assert torch.equal(v2.view(torch.uint8).cpu(), cache[1].view(torch.uint8).cpu()), (L, splits, "V bytes")
        err = float((out.cpu().double() - want).abs().max() / want.abs().max())
        assert err <= 1e-2, (heads, kv, d, L, splits, block_n, rep, err)
    assert torch.equal(outs[0], outs[1]), (L, splits, "EARLY_IO: other bits")
    print("ok", heads, kv, d, L, splits, block_n, f"{err:.2e}")


def check_rope(heads, kv, d, L, splits, block_n, deq, ks=0.5, vs=0.25):
    # ROPE: unrotated q / k with the position give the bits of the rotary kernel + the plain launch (cache too)
    from octavo.nn.rotary import get_rope
    from octavo.plugins.platforms.cuda_fusions import rotary

    rope = get_rope(d, 4096, 500000.0).to(DEV)
    q, kc, vc, _, _, bt, tables = paged_case(gen, heads, kv, d, [L], E4M3, torch.bfloat16, ks, vs, PAGE)
    q = (q * 3).to(torch.bfloat16).to(DEV)
    kn = (torch.randn(1, kv, d, generator=gen) * 2).to(torch.bfloat16).to(DEV)
    vn = torch.randn(1, kv, d, generator=gen).to(torch.bfloat16).to(DEV)
    pos = torch.tensor([L - 1 + 1000], device=DEV)
    slot = torch.tensor([tables[0][(L - 1) // PAGE] * PAGE + (L - 1) % PAGE], device=DEV)
    qr, kr = rotary(rope, pos, q.reshape(1, -1), kn.reshape(1, -1))
    got = []
    for fused in (False, True):
        k2, v2 = kc.to(DEV), vc.to(DEV)
        out = torch.full((1, heads, d), float("nan"), dtype=torch.bfloat16, device=DEV)
        args = (q, kn, vn, {"rope": (pos, rope.cos_cache, rope.sin_cache)}) if fused else \
            (qr.view(1, heads, d), kr.view(1, kv, d), vn, {})
        fp8_decode_one(*args[:3], k2, v2, bt[0].to(DEV), torch.tensor([L], dtype=torch.int32, device=DEV), slot,
                       out, scale=d ** -0.5 * ks, k_scale=ks, v_scale=vs, splits=splits, block_n=block_n, deq=deq,
                       pdl=PDL, early_io=fused, **args[3])
        got.append((out, k2.view(torch.uint8).cpu(), v2.view(torch.uint8).cpu()))
    assert all(torch.equal(a, b) for a, b in zip(*got)), (heads, kv, d, L, splits, "ROPE: other bits")
    print("ok rope", heads, kv, d, L, splits)


if DEV.type == "cuda":  # Llama-3-8B heads, the engine's conversion (deq 3); contexts to 2,000
    for L, splits, bn in ((700, 16, 64), (2000, 16, 64), (1, 16, 64), (700, 8, 128)):
        check_rope(32, 8, 128, L, splits, bn, 3, ks=0.05, vs=0.02)
    # (8, 128): session 16's one-tile launch (every past key of a context <= 1,024 read before the PDL wait)
    for L, splits, bn in ((1, 16, 64), (700, 16, 64), (2000, 16, 64), (2000, 8, 64), (129, 1, 64), (1500, 32, 32),
                          (700, 8, 128), (1100, 8, 128)):
        check(32, 8, 128, L, splits, bn, 3, ks=0.05, vs=0.02)
    # a CUDA graph captured once, replayed at other lengths (the tickets reset inside the launch)
    heads, kv, d, ks, vs = 32, 8, 128, 0.05, 0.02
    q, kc, vc, kf, vf, bt, tables = paged_case(gen, heads, kv, d, [2000], E4M3, torch.bfloat16, ks, vs, PAGE)
    q, kc, vc, bt = q.to(DEV), kc.to(DEV), vc.to(DEV), bt.to(DEV)
    kn = torch.randn(1, kv, d, device=DEV, dtype=torch.bfloat16)
    vn = torch.randn(1, kv, d, device=DEV, dtype=torch.bfloat16)
    lens = torch.tensor([2000], dtype=torch.int32, device=DEV)
    slot = torch.tensor([-1], device=DEV)  # no store: the graph's replays read the cache as built
    out = torch.empty(1, heads, d, dtype=torch.bfloat16, device=DEV)
    run = lambda: fp8_decode_one(q, kn, vn, kc, vc, bt[0], lens, slot, out, scale=d ** -0.5 * ks, k_scale=ks,
                                 v_scale=vs, splits=16, block_n=64, deq=3, early_io=True, pdl=PDL)
    run()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    kq = dequantize((kn.float() / ks).clamp(-448, 448).to(E4M3).cpu(), ks, torch.float64)
    vq = dequantize((vn.float() / vs).clamp(-448, 448).to(E4M3).cpu(), vs, torch.float64)
    for L in (1700, 3, 2000, 640):
        lens.fill_(L)
        g.replay()
        kf2, vf2 = kf.clone(), vf.clone()  # the new token (position L - 1) comes from registers
        b, o = tables[0][(L - 1) // PAGE], (L - 1) % PAGE
        kf2[b, o], vf2[b, o] = kq[0], vq[0]
        want = reference(q.cpu(), kf2, vf2, tables, [L], d ** -0.5)
        err = float((out.cpu().double() - want).abs().max() / want.abs().max())
        assert err <= 1e-2, ("graph", L, err)
        print("ok graph", L, f"{err:.2e}")
else:
    for L, splits, bn in ((1, 4, 16), (70, 4, 16), (33, 16, 16), (130, 1, 32), (100, 2, 64)):
        check(8, 2, 32, L, splits, bn, 0)
    check(16, 4, 64, 45, 8, 16, 0)
    check_rope(8, 2, 32, 70, 4, 16, 0)
    check_rope(8, 2, 32, 33, 16, 16, 0)

# through the triton backend: one decode token of one request takes the one launch with =1, not with =0
if DEV.type == "cpu":
    from octavo.plugins.attention.triton import TritonAttentionBackend
    from octavo.testing.attention import make_layout
    import octavo.plugins.attention._fp8_kv_decode_bs1 as one_mod

    one_mod.DEFAULT_LAUNCH.update(deq=0, block_n=16)  # the interpreter runs no inline PTX (deq 3)
    CALLS = []
    _orig = one_mod.fp8_decode_one
    one_mod.fp8_decode_one = lambda *a, **kw: (CALLS.append(kw["splits"]), _orig(*a, **kw))[1]
    results = {}
    for flag in ("0", "1"):
        os.environ["OCTAVO_FP8_DECODE_ONE"] = flag
        impl = TritonAttentionBackend(num_heads=8, head_size=32, num_kv_heads=2, scale=32 ** -0.5)
        impl.k_scale, impl.v_scale = 0.5, 0.25
        g = torch.Generator().manual_seed(1)
        cache = torch.zeros(2, 40, PAGE, 2, 32, dtype=E4M3)

        def step(layout, g=g, impl=impl, cache=cache):
            md = TritonAttentionBackend.build_metadata(layout, DEV)
            n = layout.num_tokens
            k, v = torch.randn(n, 2, 32, generator=g) * 4, torch.randn(n, 2, 32, generator=g) * 2
            return impl.forward(torch.randn(n, 8, 32, generator=g), k, v, cache, md)

        CALLS.clear()
        step(make_layout([[1, 2, 3, 4]], [0], [50], PAGE))  # prefill
        two = step(make_layout([[5, 6], [7, 8]], [0, 0], [3, 3], PAGE))  # prefills of two requests
        step(make_layout([[5, 6], [7, 8]], [3, 3], [1, 1], PAGE))  # a decode step of two requests
        assert CALLS == [], CALLS
        one = step(make_layout([[1, 2, 3, 4]], [50], [1], PAGE))  # one decode token of one request
        assert CALLS == ([] if flag == "0" else [one_mod.DEFAULT_LAUNCH["splits"]]), (flag, CALLS)
        results[flag] = (one, cache.view(torch.uint8).clone(), two)
    err = float((results["1"][0].double() - results["0"][0].double()).abs().max() / results["0"][0].abs().max())
    assert err <= 1e-2, err
    assert torch.equal(results["1"][1], results["0"][1]), "cache bytes differ"
    print("ok backend", f"{err:.2e}")
    os.environ["OCTAVO_FP8_DECODE_ONE"] = "yes"
    try:
        one_launch(E4M3, 4, 128, 1, 1, 0, 0.0)
        raise AssertionError("accepted 'yes'")
    except ValueError as e:
        assert "OCTAVO_FP8_DECODE_ONE" in str(e)
    os.environ["OCTAVO_FP8_DECODE_ONE"] = "1"
    assert one_launch(torch.bfloat16, 4, 128, 1, 1, 0, 0.0) is None and one_launch(E4M3, 4, 96, 1, 1, 0, 0.0) is None
    assert one_launch(E4M3, 4, 128, 2, 2, 0, 0.0) is None and one_launch(E4M3, 4, 128, 1, 1, 64, 0.0) is None
    os.environ.pop("OCTAVO_FP8_DECODE_ONE")
print("PASS")
"""


def _run(env_extra):
    env = {**os.environ, **env_extra}
    env.pop("OCTAVO_FP8_DECODE_ONE", None)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600, cwd=root)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_fp8_decode_one_interpreted():
    out = _run({"TRITON_INTERPRET": "1", "DECODE_TEST_DEVICE": "cpu"})
    assert out.count("ok ") == 9 and "ok backend" in out and out.count("ok rope") == 2


@pytest.mark.gpu
@needs_cuda
def test_fp8_decode_one_on_cuda():
    out = _run({"DECODE_TEST_DEVICE": "cuda"})
    assert out.count("ok ") == 8 + 4 + 4 and out.count("ok rope") == 4


@pytest.mark.parametrize("early_io,rope", [(False, False), (True, False), (True, True)])
def test_sm90_early_io_loads_sit_where_asked(early_io, rope):
    """sm_90 PTX of the engine's launch (Triton's own compiler, CPU): with ``EARLY_IO`` the slot (a 64-bit load) is
    asked for before the PDL wait and q / k / v all before the first barrier after it; without it q's shared-memory
    store and barrier come between q and the new k / v (two round trips; the slot after them: a third)."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget

    from octavo.plugins.attention._fp8_kv_decode_bs1 import _fp8_decode_one_kernel

    names = ["q_ptr", "k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr", "table_ptr", "seq_len_ptr", "slot_ptr", "out_ptr",
             "part_ptr", "ml_ptr", "count_ptr", "stride_qh", "stride_kh", "stride_vh", "stride_oh", "stride_blk",
             "stride_pos", "scale_log2", "out_scale", "k_scale", "v_scale"]
    types = ["*bf16"] * 3 + ["*fp8e4nv"] * 2 + ["*i32", "*i32", "*i64", "*bf16", "*fp32", "*fp32", "*i32"] \
        + ["i32"] * 6 + ["fp32"] * 4
    consts = dict(GROUP=4, G_P=16, HEAD=128, PAGE=16, BLOCK_N=64, SPLITS=16, DEQ=3, EARLY=True, PDL=True,
                  EARLY_IO=early_io, ROPE=rope)
    sig = dict(zip(names, types))
    if rope:
        sig.update(pos_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32", stride_cos="i32")
    else:
        consts.update(pos_ptr=None, cos_ptr=None, sin_ptr=None, stride_cos=0)
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(18)}  # what the JIT specializes for the engine's tensors
    src = triton.compiler.ASTSource(fn=_fp8_decode_one_kernel, signature={**sig, **{k: "constexpr" for k in consts}},
                                    constexprs=consts, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 4, "num_stages": 1}).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert bool(re.search(r"ld\.global[\w.]*b64", ptx[:wait])) == early_io  # the slot (rope: + the position)
    if rope:  # position, cos, sin before the wait; after it q, k and their partner columns, v: all before a barrier
        assert len(re.findall(r"ld\.global[\w.]*b64", ptx[:wait])) == 2
        assert "fma.rn.f32" in ptx[wait:]
    after = re.findall(r"ld\.global[\w.]*|bar\.sync", ptx[wait:])
    first_bar = after.index("bar.sync")
    assert (first_bar >= 4) == early_io, after[:8]  # k, v, q (two vector loads) before the first barrier
