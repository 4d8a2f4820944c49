"""The ``triton`` backend builds no new kernel variant when only a step's request count or block-table width
changes (issue 17, session 8): those values used to be Triton specializations (== 1, multiple of 16, other; and
the 16-byte alignment of a mixed step's table / seq_lens / query-start views past its decode rows), so a timed
run could compile a variant its warm-up never met (session 7: `_paged_decode_kernel`, 0.67 s inside the timed
nano-vllm run). Every step is also checked against the float64 reference.

The Qwen3-0.6B head shape (16 q / 8 KV heads, 128, bf16): its decode rows take the decode kernel
(``_triton_decode_table``), the prefill rows of a mixed step the general kernel."""

import pytest
import torch

from tests.gpu.paged_reference import make_case, reference, rel_err

pytestmark = pytest.mark.gpu

HEADS, KV_HEADS, D, PAGE = 16, 8, 128, 16


def _steps():
    """(decode contexts, prefill (ctx, q) rows): decode-row counts 1 / 16 / 17 / 5 / 32 / 2, tables 11 / 4 / 21 /
    41 / 16 / 2 blocks wide (make_case adds one spare column); prefill chunks of 40 tokens, and one of 12 (every
    chunk over 8 tokens takes the general kernel's full BLOCK_Q, a real constexpr)."""
    return [
        ([150], [(0, 40)]),  # the first step builds what it needs; the ones below must not build more
        ([7] * 16, [(0, 40)]),  # 16 decode rows, a 4-block table (+1)
        ([100 + 13 * i for i in range(17)], [(200, 40)]),  # 17 rows: views past them are 4-byte aligned only
        ([5, 3, 9, 1, 2], [(0, 40), (590, 40)]),  # 5 rows, width 40
        ([16 * 15 - 1] * 32, [(1, 40)]),  # 32 rows, width 16
        ([3, 4], [(0, 12)]),  # a 12-token chunk (a prefill's tail): the same full tile as 40 tokens
    ]


def test_varied_steps_build_no_new_variant_and_match_float64(device, monkeypatch):
    if device.type != "cuda":
        pytest.skip("counts compiled GPU variants")
    from octavo.plugins.attention import _triton_decode, _triton_kernels
    from octavo.plugins.attention.triton import TritonAttentionBackend

    kernels = (_triton_decode._paged_decode_kernel, _triton_kernels._paged_attention_kernel)
    builds: list[str] = []
    for k in kernels:
        orig = k._do_compile  # called on an in-memory cache miss (compile or disk-cache load)
        monkeypatch.setattr(k, "_do_compile", lambda *a, _o=orig, _n=k.__name__, **kw: (builds.append(_n),
                                                                                         _o(*a, **kw))[1])
    calls = []
    orig_decode = _triton_decode.paged_decode
    monkeypatch.setattr(_triton_decode, "paged_decode",
                        lambda *a, **kw: (calls.append(kw["num_reqs"]), orig_decode(*a, **kw))[1])
    be = TritonAttentionBackend(num_heads=HEADS, head_size=D, num_kv_heads=KV_HEADS, scale=D ** -0.5)
    widths = []
    for i, (decodes, prefills) in enumerate(_steps()):
        seqs = [(c, 1) for c in decodes] + prefills
        case = make_case(seqs, HEADS, KV_HEADS, D, PAGE, torch.bfloat16, device, seed=i)
        widths.append(case.layout.block_tables.shape[1])
        md = TritonAttentionBackend.build_metadata(case.layout, device)
        out = be.forward(case.query, case.key, case.value, case.kv_cache, md)
        err = rel_err(out, reference(case, D ** -0.5))
        assert err < 2e-2, (i, err)
        if i == 0:
            first_builds = len(builds)
    assert calls == [len(d) for d, _ in _steps()], calls  # every step's decode rows took the decode kernel
    assert len(set(widths)) == len(widths), widths
    assert builds[first_builds:] == [], (f"steps 2.. built {builds[first_builds:]} (table widths {widths}): a value "
                                         "that changes per step is specialized again")


def test_decode_only_steps_of_any_size_share_one_variant(device, monkeypatch):
    """Decode-only steps of 3 / 1 / 16 / 17 / 24 requests (graph sizes are 1, 2, 4, 8, 16, 24 ...: num_reqs == 1,
    a multiple of 16 or neither) with tables 20 / 2 / 16 / 17 / 8 blocks wide run one build of the decode kernel."""
    if device.type != "cuda":
        pytest.skip("counts compiled GPU variants")
    from octavo.plugins.attention import _triton_decode
    from octavo.plugins.attention.triton import TritonAttentionBackend

    k = _triton_decode._paged_decode_kernel
    builds = []
    orig = k._do_compile
    monkeypatch.setattr(k, "_do_compile", lambda *a, **kw: (builds.append(1), orig(*a, **kw))[1])
    be = TritonAttentionBackend(num_heads=HEADS, head_size=D, num_kv_heads=KV_HEADS, scale=D ** -0.5)
    be._num_splits = lambda md, block_n, dev: 1  # few requests would split the context (the general kernel)
    mark = None
    for i, (n, ctx) in enumerate([(3, 300), (1, 10), (16, 16 * 15), (17, 16 * 16), (24, 100)]):
        case = make_case([(ctx - 1, 1)] * n, HEADS, KV_HEADS, D, PAGE, torch.bfloat16, device, seed=10 + i)
        md = TritonAttentionBackend.build_metadata(case.layout, device)
        out = be.forward(case.query, case.key, case.value, case.kv_cache, md)
        assert rel_err(out, reference(case, D ** -0.5)) < 2e-2, (n, ctx)
        if mark is None:
            mark = len(builds)
    assert len(builds) == mark, f"{len(builds) - mark} more builds after the first decode step"
