"""Cases for the ``triton`` backend's decode launch table and longest-first request order
(``plugins/attention/_triton_decode.py``, ``_triton_decode_table.py``, ``triton.py``).

Not collected directly: ``test_triton_decode_cpu.py`` runs this file under ``TRITON_INTERPRET=1`` (small shapes);
on a CUDA machine run it directly (`NANO_PART=cases bash benchmarks/device/nano7.sh` does: the real Qwen3-0.6B / Llama-3-8B head shapes,
contexts to 2,000, bf16 and fp8 caches, and a CUDA graph whose replays must recompute the order). References: a
float64 computation over the (dequantized) cache, and the general kernel (``OCTAVO_TRITON_DECODE_KERNEL=0``).
"""

from __future__ import annotations

import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("needs CUDA or TRITON_INTERPRET=1 (run through test_triton_decode_cpu.py)", allow_module_level=True)

from octavo.nn.kv_quant import quantize  # noqa: E402
from octavo.plugins.attention._triton_decode import longest_first, paged_decode  # noqa: E402
from octavo.plugins.attention.triton import TritonAttentionBackend  # noqa: E402
from octavo.testing.attention import make_layout  # noqa: E402
from tests.quant.fp8_attn_cases import paged_case, reference  # noqa: E402

DEV = torch.device("cpu" if INTERPRET else "cuda")
PAGE = 16
E4M3 = torch.float8_e4m3fn
# (q heads, kv heads, head size, contexts): tiny under the interpreter, the served shapes on a GPU
SHAPES = ([(4, 2, 32, [1, 17, 130, 64, 200]), (8, 2, 16, [5, 129, 33])] if INTERPRET else
          [(16, 8, 128, [1, 100, 2000, 777, 128, 129, 1600, 15] * 8), (32, 8, 128, [1000, 2000, 1, 1537] * 16)])
# the interpreter's bf16 dots return garbage (general kernel too: numpy has no bf16), so it checks fp16 caches
HALF = torch.float16 if INTERPRET else torch.bfloat16
CACHES = (HALF, E4M3)
# (block_n, warps, stages, chunk): the table's launches; benchmarks/decode_attn_bench.py checks the others
LAUNCHES = ([(64, 4, 2, 0), (32, 4, 2, 64)] if INTERPRET else [(64, 4, 2, 0), (128, 4, 2, 0), (128, 4, 2, 512)])


def _case(heads, kv_heads, d, ctx, cache_dtype, seed=0, ks=0.5, vs=0.25):
    """tests/quant/fp8_attn_cases.paged_case (same draws in the same order), on DEV; a 16-bit cache's float64 twin
    is the rounded cache, not the unrounded draw."""
    q, kc, vc, kf, vf, bt, tables = paged_case(torch.Generator().manual_seed(seed), heads, kv_heads, d, ctx,
                                               cache_dtype, HALF, ks, vs, PAGE)
    if cache_dtype != E4M3:
        kf, vf = kc.double(), vc.double()
    return q.to(DEV), kc.to(DEV), vc.to(DEV), kf, vf, bt.to(DEV), tables


@pytest.mark.parametrize("n", [1, 7, 64, 65, 130, 300])
def test_longest_first_is_the_stable_descending_order(n):
    gen = torch.Generator().manual_seed(n)
    lens = torch.randint(1, 40, (n,), generator=gen, dtype=torch.int32)  # many ties
    got = longest_first(lens.to(DEV), n).cpu()
    want = torch.argsort(-lens.long(), stable=True).to(torch.int32)
    assert torch.equal(got, want), (got[:20], want[:20])
    # a prefix of a longer tensor (the decode rows of a mixed step) reads only its first n entries
    longer = torch.cat([lens, torch.full((5,), 99, dtype=torch.int32)])
    assert torch.equal(longest_first(longer.to(DEV), n).cpu(), want)


@pytest.mark.skipif(INTERPRET, reason="CUDA graphs: GPU only")
@pytest.mark.parametrize("launch", ["block_n=128,warps=4,stages=2,ordered=1",
                                    "block_n=128,warps=4,stages=2,ordered=1,chunk=512"])
def test_graph_replay_recomputes_the_order(monkeypatch, launch):
    """Capture two layers' decode in a CUDA graph with the ordered (and chunked) launch, then change the contexts
    in place: each replay must equal an eager step over the new contexts (the captured order kernel reran)."""
    heads, kv_heads, d = 16, 8, 128
    monkeypatch.setenv("OCTAVO_TRITON_DECODE_LAUNCH", launch)
    impls = [TritonAttentionBackend(num_heads=heads, head_size=d, num_kv_heads=kv_heads, scale=d ** -0.5)
             for _ in range(2)]
    n, width = 48, 130
    gen = torch.Generator().manual_seed(5)
    kv = torch.randn(2, n * width + 1, PAGE, kv_heads, d, generator=gen).to(torch.bfloat16).to(DEV)
    tables = (torch.arange(n * width, dtype=torch.int32) + 1).view(n, width)[:, torch.randperm(width, generator=gen)]
    q = torch.randn(n, heads, d, generator=gen).to(torch.bfloat16).to(DEV)
    layout = make_layout([[0] * width] * n, [0] * n, [1] * n, PAGE)  # placeholders: the buffers get real values
    md = TritonAttentionBackend.build_metadata(layout, DEV)
    md.block_tables.copy_(tables.to(DEV))
    md.slot_mapping.fill_(-1)  # K/V below are never written
    md.max_seq_len = width * PAGE
    kk = torch.zeros(n, kv_heads, d, dtype=torch.bfloat16, device=DEV)

    def fwd():
        return [impl.forward(q, kk, kk, kv, md) for impl in impls]

    def set_lens(seed):
        g = torch.Generator().manual_seed(seed)
        md.seq_lens.copy_(torch.randint(1, width * PAGE, (n,), generator=g, dtype=torch.int32).to(DEV))

    set_lens(0)
    fwd()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fwd()
    for seed in (1, 2, 3):
        set_lens(seed)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(md.scratch[("order", n)].cpu(),  # the replay (not an eager call) reordered
                           torch.argsort(-md.seq_lens.cpu().long(), stable=True).int())
        want = fwd()  # eager with the same metadata (its first layer recomputes the order too)
        for o, w in zip(outs, want):
            assert torch.equal(o, w)


@pytest.mark.parametrize("cache", CACHES, ids=["16bit", "fp8"])
@pytest.mark.parametrize("shape", range(len(SHAPES)))
@pytest.mark.parametrize("block_n,warps,stages,chunk", LAUNCHES)
def test_decode_launches_match_float64_and_any_order_is_bitwise_equal(shape, cache, block_n, warps, stages, chunk):
    heads, kv_heads, d, ctx = SHAPES[shape]
    fp8 = cache == E4M3
    ks, vs = (0.5, 0.25) if fp8 else (1.0, 1.0)
    q, kc, vc, kf, vf, bt, tables = _case(heads, kv_heads, d, ctx, cache, seed=shape, ks=ks, vs=vs)
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEV)
    qsl = torch.arange(len(ctx) + 1, dtype=torch.int32, device=DEV)
    outs = []
    reverse = torch.arange(len(ctx) - 1, -1, -1, dtype=torch.int32, device=DEV)
    for order in (None, longest_first(lens, len(ctx)), reverse):
        out = torch.full_like(q, float("nan"))
        paged_decode(q, kc, vc, out, bt, lens, qsl, num_reqs=len(ctx), num_kv_heads=kv_heads,
                     scale=d ** -0.5 * ks, v_scale=vs, block_size=PAGE, block_n=block_n, num_warps=warps,
                     num_stages=stages, order=order, chunk=chunk, max_seq_len=max(ctx))
        outs.append(out)
    want = reference(q.cpu(), kf, vf, tables, ctx, d ** -0.5)
    err = float((outs[0].cpu().double() - want).abs().max() / want.abs().max())
    assert err <= 2e-2, err  # bf16 P and output rounding (fp8: fp16 dots)
    for other in outs[1:]:
        assert torch.equal(other, outs[0])  # each (request, KV head) is computed the same way in any order


def _backend_step(impls, layout, cache, seed, ks=1.0, vs=1.0):
    md = TritonAttentionBackend.build_metadata(layout, DEV)
    impl0 = impls[0]
    gen = torch.Generator().manual_seed(seed)
    n, kvh, d = layout.num_tokens, impl0.num_kv_heads, impl0.head_size
    k = (torch.randn(n, kvh, d, generator=gen) * 2).to(DEV)
    v = torch.randn(n, kvh, d, generator=gen).to(DEV)
    q = torch.randn(n, impl0.num_heads, d, generator=gen).to(HALF).to(DEV)
    outs = [impl.forward(q, k.to(HALF), v.to(HALF), cache, md).cpu() for impl in impls]
    return outs, md


@pytest.mark.parametrize("cache", CACHES, ids=["16bit", "fp8"])
def test_backend_launch_table_and_order_match_general_kernel(monkeypatch, cache):
    """Two layers over one metadata (the first owns the step's order, the second reads it), decode-only and
    mixed steps, ordered (chunked, K/V-writing) launches vs the general kernel: outputs, and the cache bytes
    written; the decode rows (only they) take the decode kernel."""
    import octavo.plugins.attention._triton_decode as td

    heads, kv_heads, d, ctx = (4, 2, 16, [300, 40, 290, 9]) if INTERPRET else SHAPES[0]
    fp8 = cache == E4M3
    ks, vs = (0.5, 0.25) if fp8 else (1.0, 1.0)
    calls = []
    orig = td.paged_decode
    monkeypatch.setattr(td, "paged_decode", lambda *a, **kw: (calls.append((kw["num_reqs"], kw["order"] is not None,
                                                                            kw["block_n"], kw["chunk"], kw["new_kv"] is not None)),
                                                                 orig(*a, **kw))[1])
    ctx = [max(c, 2) for c in ctx]  # prompts of >= 2 tokens: the first step has no decode rows
    r = len(ctx)
    tables, at = [], 1
    for c in ctx + [40]:  # (on a GPU 64 requests: enough that the step does not split the context)
        tables.append(list(range(at, at + (c + PAGE) // PAGE + 1)))
        at += len(tables[-1])
    results = {}
    for flag, launch in (("0", ""), ("", "block_n=64,warps=4,stages=2,ordered=1"),
                         ("", "block_n=64,warps=4,stages=2,ordered=1,chunk=256"),
                         ("", "block_n=64,warps=4,stages=2,ordered=1,write_kv=1")):
        monkeypatch.setenv("OCTAVO_TRITON_DECODE_KERNEL", flag)
        monkeypatch.setenv("OCTAVO_TRITON_DECODE_LAUNCH", launch)
        impls = [TritonAttentionBackend(num_heads=heads, head_size=d, num_kv_heads=kv_heads, scale=d ** -0.5)
                 for _ in range(2)]
        for impl in impls:
            impl.k_scale, impl.v_scale = ks, vs
        g = torch.Generator().manual_seed(7)  # the cached context: random K/V (the mixed step holds a prefill)
        kv = torch.stack([torch.randn(at + 1, PAGE, kv_heads, d, generator=g) * 2 * ks,
                          torch.randn(at + 1, PAGE, kv_heads, d, generator=g) * vs])
        kv = (quantize(kv[0], ks, E4M3), quantize(kv[1], vs, E4M3)) if fp8 else (kv[0], kv[1])
        kv = torch.stack(kv).to(cache).to(DEV)
        calls.clear()
        decode, md = _backend_step(impls, make_layout(tables[:r], ctx, [1] * r, PAGE), kv, 2, ks, vs)
        mixed, _ = _backend_step(impls, make_layout(tables, [c + 1 for c in ctx] + [0], [1] * r + [12], PAGE), kv, 3,
                                 ks, vs)
        if launch:
            chunk = 256 if "chunk" in launch else 0  # 2 layers x (decode-only, the mixed step's decodes):
            wkv = "write_kv" in launch  # only decode-only steps store K/V in the decode launch
            assert calls == [(r, True, 64, chunk, wkv)] * 2 + [(r, True, 64, chunk, False)] * 2, calls
            owner = md.scratch[("order_owner", r)]
            assert owner == id(impls[0]), "the first layer owns the step's order"
            assert torch.equal(md.scratch[("order", r)].cpu(), torch.argsort(-torch.tensor(ctx), stable=True).int())
        else:
            assert calls == []
        results[launch] = (decode, mixed, [kv.cpu()])
    for launch in list(results)[1:]:
        assert torch.equal(results[launch][2][0], results[""][2][0]), launch  # the same cache bytes written
        for name, a, b in zip(("decode", "mixed"), results[launch][:2], results[""][:2]):
            for x, y in zip(a, b):
                err = float((x.double() - y.double()).abs().max() / y.double().abs().max())
                assert err <= 2e-2, (launch, name, err)


def test_launch_switch_refuses_bad_values(monkeypatch):
    from octavo.plugins.attention._triton_decode_table import DecodeLaunch, decode_launch

    for raw in ("block_n=128", "block_n=96,warps=4,stages=2,ordered=1", "block_n=128,warps=4,stages=2,ordered=1,x=1",
                "block_n=128,warps=4,stages=2,ordered=yes", "block_n=128,block_n=64,warps=4,stages=2,ordered=1",
                "block_n=128,warps=4,stages=2,ordered=1,chunk=100"):
        monkeypatch.setenv("OCTAVO_TRITON_DECODE_LAUNCH", raw)
        with pytest.raises(ValueError, match="OCTAVO_TRITON_DECODE_LAUNCH"):
            decode_launch("16bit", 2, 128)
    monkeypatch.setenv("OCTAVO_TRITON_DECODE_LAUNCH", "block_n=128,warps=8,stages=3,ordered=1")
    assert decode_launch("fp32", 4, 32) == DecodeLaunch(128, 8, 3, True, 0)
    monkeypatch.setenv("OCTAVO_TRITON_DECODE_LAUNCH", "block_n=128,warps=8,stages=3,ordered=0,chunk=512")
    assert decode_launch("16bit", 2, 128) == DecodeLaunch(128, 8, 3, False, 512)
    monkeypatch.setenv("OCTAVO_TRITON_DECODE_KERNEL", "0")
    with pytest.raises(ValueError, match="OCTAVO_TRITON_DECODE_LAUNCH"):
        TritonAttentionBackend(num_heads=4, head_size=32, num_kv_heads=2, scale=0.1)
    monkeypatch.delenv("OCTAVO_TRITON_DECODE_LAUNCH")
    monkeypatch.delenv("OCTAVO_TRITON_DECODE_KERNEL")
    assert decode_launch("fp32", 4, 32) is None  # float32 caches keep the general kernel
    assert decode_launch("fp32", 4, 32, forced=True) == DecodeLaunch()
    assert decode_launch("fp8", 3, 64) is not None  # fp8 caches always take the decode kernel
    from octavo.plugins.attention._triton_decode_table import TABLE

    for (kind, group, head), launch in TABLE.items():  # the backend looks its layer's shape up in the table
        impl = TritonAttentionBackend(num_heads=8 * group, head_size=head, num_kv_heads=8, scale=0.1)
        dtypes = (torch.bfloat16, torch.float16) if kind == "16bit" else (E4M3, torch.float8_e5m2)
        for dt in dtypes:
            assert impl._decode_launch(dt, kind == "fp8") == launch
        assert impl._decode_launch(torch.float32, False) is None


@pytest.mark.parametrize("splits", [2, 16])
def test_split_kv_decode_matches_float64(monkeypatch, splits):
    """Decode rows with their contexts split over ``splits`` programs (the general kernel + its merge: what small
    batches run under ``triton.SPLIT_RULE``, up to the rule's cap of 16, with empty splits for short contexts)
    equal float64 over the cache the step wrote, and the unsplit launch to bf16 rounding."""
    heads, kv_heads, d, ctx = SHAPES[0]
    ctx = ctx[:5] if INTERPRET else ctx[:12]
    q, kc, vc, _, _, bt, tables = _case(heads, kv_heads, d, ctx, HALF, seed=5)
    gen = torch.Generator().manual_seed(6)
    k_new = (torch.randn(len(ctx), kv_heads, d, generator=gen) * 2).to(HALF).to(DEV)
    v_new = torch.randn(len(ctx), kv_heads, d, generator=gen).to(HALF).to(DEV)
    layout = make_layout(tables, [c - 1 for c in ctx], [1] * len(ctx), PAGE)
    outs = {}
    for n in (1, splits):
        impl = TritonAttentionBackend(num_heads=heads, head_size=d, num_kv_heads=kv_heads, scale=d ** -0.5)
        monkeypatch.setenv("OCTAVO_TRITON_DECODE_KERNEL", "0")  # the general kernel for every row, split or not
        monkeypatch.setattr(impl, "_num_splits", lambda md, block_n, dev, n=n: n)
        kv = torch.stack([kc, vc]).clone()
        md = TritonAttentionBackend.build_metadata(layout, DEV)
        outs[n] = impl.forward(q, k_new, v_new, kv, md).cpu().double()
    kf, vf = kv[0].cpu().double(), kv[1].cpu().double()  # the cache with this step's K/V in it
    want = reference(q.cpu(), kf, vf, tables, ctx, d ** -0.5)
    for n, out in outs.items():
        err = float((out - want).abs().max() / want.abs().max())
        assert err <= 2e-2, (n, err)
    assert float((outs[splits] - outs[1]).abs().max() / outs[1].abs().max()) <= 2e-2
