"""The L2 prefetch hints of the batch-1 MoE kernels (plugins/platforms/moe_prefetch.py) and the w13 launch's
routing switch, on the CPU.

- the byte split covers exactly what is asked, in 16-byte pieces, and the CPU/interpreter gets no prefetch;
- the kernels compiled for sm_90 (Triton's own compiler, no GPU) hold ``cp.async.bulk.prefetch.L2`` exactly when
  asked, before or after ``griddepcontrol.wait`` as asked, and the evict-first hint on the w13 loads;
- bad settings are refused with an error naming them;
- under the interpreter: the w13 launch reading the ids of a separate routing launch (``"ROUTE": "launch"``) gives
  the in-kernel routing's output, weights and ids bit for bit; prefetch settings change nothing there; the
  attention's unrolled merge (``merge=1``) gives the loop's output and cache bit for bit, and so does the w13
  launch with its loads one K-block ahead (``"PIPE": true``) and with the routing by ranks (``"ROUTE": "rank"``,
  ties included).
The GPU side (bit-equal outputs with and without prefetch, eager and in a graph) is test_moe_prefetch_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")


@pytest.mark.parametrize("nbytes,shares,pieces", [(16 << 20, 64, 16), (3 << 20, 48, 4), (21 << 20, 512, 4),
                                                  (1000, 8, 4), (17, 2, 2), (15, 4, 4), (0, 4, 4)])
def test_split_covers_the_asked_bytes(nbytes, shares, pieces):
    from octavo.plugins.platforms.moe_prefetch import split_bytes

    total, piece = split_bytes(nbytes, shares, pieces)
    if nbytes < 16:
        assert (total, piece) == (0, 16)
        return
    assert total == nbytes // 16 * 16 and piece % 16 == 0
    assert shares * pieces * piece >= total > shares * pieces * (piece - 16)  # the smallest covering piece


def test_no_prefetch_on_the_cpu():
    from octavo.plugins.platforms.moe_prefetch import prefetch_split

    assert prefetch_split(torch.empty(4096), 4, 4) == (0, 16)
    assert prefetch_split(None, 4, 4) == (0, 16)


def _ptx(fn, signature: dict, constexprs: dict) -> str:
    import triton
    from triton.backends.compiler import GPUTarget

    src = triton.compiler.ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}},
                                    constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


def _where(ptx: str) -> str:
    """'none', 'before' or 'after' the PDL wait: where the prefetch sits."""
    i, j = ptx.find("cp.async.bulk.prefetch.L2.global"), ptx.find("griddepcontrol.wait")
    return "none" if i < 0 else ("before" if i < j else "after")


def test_sm90_kernels_hold_the_prefetch_exactly_where_asked():
    from octavo.plugins.platforms.moe_decode_attention import _attn_one_kernel
    from octavo.plugins.platforms.moe_decode_kernels import _w2_sum_kernel, _w13_route_kernel

    sig13 = {"x_ptr": "*bf16", "logits_ptr": "*bf16", "w13_ptr": "*bf16", "act_ptr": "*bf16", "weights_ptr": "*fp32",
             "ids_ptr": "*i64", "num_experts": "i32", "N": "i32", "K": "i32", "stride_be": "i32", "stride_bn": "i32",
             "w2_ptr": "*u8", "w2_bytes": "i64", "w2_piece": "i64", "pf_ptr": "*u8", "pf_total": "i64",
             "pf_piece": "i64", "flag_ptr": "*i32"}  # flag_ptr: the early w2's flag (moe_w2_early.py), unused here
    c13 = dict(TOP_K=8, K_P=8, E_P=128, RENORMALIZE=True, BLOCK_N=16, BLOCK_K=256, PDL=True, ROUTE_IN=True, PIPE=False,
               RANK=False, RANK_CH=16, FLAG=False, PARTIAL=False)
    ptx = _ptx(_w13_route_kernel, sig13, {**c13, "PF_W2": True, "EVICT": "evict_first", "PF_NEXT": False})
    assert _where(ptx) == "after" and "evict_first" in ptx  # the expert is known only after the wait
    ptx = _ptx(_w13_route_kernel, sig13, {**c13, "PF_W2": False, "EVICT": "", "PF_NEXT": True})
    assert _where(ptx) == "before" and "evict_first" not in ptx  # the next layer's weight: before the wait
    sig2 = {"act_ptr": "*bf16", "w2_ptr": "*bf16", "weights_ptr": "*fp32", "ids_ptr": "*i64", "out_ptr": "*bf16",
            "N": "i32", "K": "i32", "stride_be": "i32", "stride_bn": "i32", "pf_ptr": "*u8", "pf_total": "i64",
            "pf_piece": "i64"}
    c2 = dict(TOP_K=8, K_P=8, BLOCK_N=4, BLOCK_K=256, PDL=True)
    assert _where(_ptx(_w2_sum_kernel, sig2, {**c2, "PF_NEXT": 2})) == "before"
    assert _where(_ptx(_w2_sum_kernel, sig2, {**c2, "PF_NEXT": 0})) == "none"
    siga = {"qkv_ptr": "*bf16", "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "qw_ptr": "*bf16",
            "kw_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "table_ptr": "*i32",
            "seq_len_ptr": "*i32", "slot_ptr": "*i64", "out_ptr": "*bf16", "part_ptr": "*fp32", "ml_ptr": "*fp32",
            "count_ptr": "*i32", "stride_cos": "i32", "stride_blk": "i32", "stride_pos": "i32", "eps": "fp32",
            "qk_scale_log2": "fp32", "pf_ptr": "*u8", "pf_total": "i64", "pf_piece": "i64"}
    ca = dict(NUM_Q=32, NUM_KV=4, GROUP=8, G_P=16, HEAD=128, NEOX=True, PAGE=16, BLOCK_N=64, SPLITS=16, EARLY=True,
              DOT16=True, PDL=True, PREFETCH=1, PF_PIECES=16, MERGE=1)
    assert _where(_ptx(_attn_one_kernel, siga, ca)) == "after"


def test_bad_settings_are_refused():
    from octavo.plugins.platforms.moe_decode_attention import attention_one
    from octavo.plugins.platforms.moe_decode_kernels import decode_one

    x, logits = torch.zeros(1, 64), torch.zeros(1, 8)
    w13, w2 = torch.zeros(8, 64, 64), torch.zeros(8, 64, 32)
    tiles = {"BLOCK_N": 16, "BLOCK_K": 32}
    for w13_extra, w2_extra, what in [({"EVICT": "evict_sometimes"}, {}, "EVICT"), ({}, {"PF_NEXT": 3}, "PF_NEXT"),
                                      ({"ROUTE": "host"}, {}, "ROUTE"),
                                      ({"ALL_SLOTS": True, "PF_W2": True}, {}, "PF_W2"),
                                      ({"ALL_SLOTS": True, "PIPE": True}, {}, "PIPE"),
                                      ({}, {"PRE": 2}, "PRE"), ({}, {"ONE": True}, "ONE")]:  # removed in session 10
        with pytest.raises(ValueError, match=what):
            decode_one(x, logits, w13, w2, 2, True, {"w13": {**tiles, **w13_extra}, "w2": {**tiles, **w2_extra}})
    with pytest.raises(ValueError, match="prefetch"):
        attention_one(None, None, None, None, None, None, 1e-6, None, None, None, None, num_heads=4,
                      num_kv_heads=2, head_size=16, scale=0.25, neox=True, prefetch=3)
    from octavo.plugins.platforms.moe_attention import DEFAULTS

    assert DEFAULTS["prefetch"] in (0, 1, 2)


_INTERP = r"""
import torch
from octavo.plugins.platforms.moe_decode_kernels import decode_one
g = torch.Generator().manual_seed(5)
for e, k, h, inter in ((16, 4, 64, 48), (6, 3, 32, 40)):
    w13 = (torch.randn(e, 2 * inter, h, generator=g) * h ** -0.5).half()
    w2 = (torch.randn(e, h, inter, generator=g) * inter ** -0.5).half()
    x = torch.randn(1, h, generator=g).half()
    logits = torch.randn(1, e, generator=g)
    tiles = {"w13": {"BLOCK_N": 16, "BLOCK_K": 32}, "w2": {"BLOCK_N": 8, "BLOCK_K": 32}}
    want = decode_one(x, logits, w13, w2, k, True, tiles)
    launch = decode_one(x, logits, w13, w2, k, True, {"w13": {**tiles["w13"], "ROUTE": "launch"}, "w2": tiles["w2"]})
    hints = decode_one(x, logits, w13, w2, k, True, {"w13": {**tiles["w13"], "PF_W2": True, "EVICT": "evict_first",
                                                             "PF_NEXT": True},
                                                     "w2": {**tiles["w2"], "PF_NEXT": 1}}, next_weight=w13[0])
    pipe = decode_one(x, logits, w13, w2, k, True, {"w13": {**tiles["w13"], "PIPE": True}, "w2": tiles["w2"]})
    rank = decode_one(x, logits, w13, w2, k, True, {"w13": {**tiles["w13"], "ROUTE": "rank"}, "w2": tiles["w2"]})
    for got in (launch, hints, pipe, rank):
        for a, b in zip(want, got):
            assert torch.equal(a, b), (e, k)
for e, k, renorm, logits in ((16, 5, False, torch.zeros(1, 16)),  # ties: the lowest expert wins, by rank too
                             (16, 4, True, torch.tensor([[0.5, 1, 1, 0.5, 2, 2, 0, 0, 3, 3, 1, 1, 2, 2, 0.5, 3]])),
                             (128, 8, True, torch.randn(1, 128, generator=g)), (8, 2, False, torch.randn(1, 8))):
    w13 = (torch.randn(e, 64, 32, generator=g) * 0.2).half()
    w2 = (torch.randn(e, 32, 32, generator=g) * 0.2).half()
    x = torch.randn(1, 32, generator=g).half()
    tiles = {"w13": {"BLOCK_N": 16, "BLOCK_K": 32}, "w2": {"BLOCK_N": 8, "BLOCK_K": 32}}
    want = decode_one(x, logits, w13, w2, k, renorm, tiles)
    got = decode_one(x, logits, w13, w2, k, renorm, {"w13": {**tiles["w13"], "ROUTE": "rank"}, "w2": tiles["w2"]})
    for a, b in zip(want, got):
        assert torch.equal(a, b), (e, k, renorm)
from octavo.plugins.platforms.moe_decode_attention import attention_one
hq, hk, d, page, blocks = 4, 2, 32, 16, 8
cache = torch.randn(2, blocks, page, hk, d, generator=g).half()
cache2 = cache.clone()
qw, kw = (1 + 0.2 * torch.randn(d, generator=g)).half(), (1 + 0.2 * torch.randn(d, generator=g)).half()
table = torch.randperm(blocks, generator=g).to(torch.int32)
ang = torch.arange(256)[:, None] * 10000.0 ** (-torch.arange(d // 2)[None, :] / (d // 2))
for n in (37, 1, 100):
    qkv = (torch.randn(1, (hq + 2 * hk) * d, generator=g) * 2).half()
    pos, seq = torch.tensor([n - 1]), torch.tensor([n], dtype=torch.int32)
    slot = torch.tensor([int(table[(n - 1) // page]) * page + (n - 1) % page])
    outs = [attention_one(qkv, pos, ang.cos(), ang.sin(), qw, kw, 1e-6, c, table, seq, slot, num_heads=hq,
                          num_kv_heads=hk, head_size=d, scale=d ** -0.5, neox=True, splits=4, block_n=16, dot16=False,
                          merge=mg) for c, mg in ((cache, 0), (cache2, 1))]
    assert torch.equal(outs[0], outs[1]) and torch.equal(cache, cache2), n
print("ok")
"""


def test_routing_launch_hints_and_unrolled_merge_give_the_same_bits_in_the_interpreter():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(_INTERP)


def test_next_weights_follow_module_order_without_new_parameters():
    """Each batch-1 MoE layer links the NEXT attention's qkv weight (the last layer none), as a plain reference:
    the model's parameters (and state dict) stay as they were."""
    from octavo.nn.fused_moe import FusedMoE
    from octavo.plugins.platforms.cuda_moe import link_next_weights

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv_proj = torch.nn.Linear(8, 24, bias=False)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn, self.mlp = Attn(), FusedMoE(4, 2, 8, 16, prefix="x")

    model = torch.nn.Sequential(Layer(), Layer(), Layer())
    for layer in model:
        layer.mlp._moe_decode = object()  # what use_triton_kernel leaves on a layer with the batch-1 path
    names = list(dict(model.named_parameters(remove_duplicate=False)))
    assert link_next_weights(model) == 2
    assert model[0].mlp._moe_next_weight is model[1].self_attn.qkv_proj.weight
    assert model[1].mlp._moe_next_weight is model[2].self_attn.qkv_proj.weight
    assert "_moe_next_weight" not in vars(model[2].mlp)
    assert list(dict(model.named_parameters(remove_duplicate=False))) == names
