"""The batch-1 w2 launch that routes itself and loads its first K-blocks before the PDL wait
(plugins/platforms/cuda_moe_w2_early.py), the one-launch w13 + w2 (cuda_moe_one_launch.py) and the o_proj GEMV
that loads its first K-blocks before the wait (cuda_moe_oproj.py), on the CPU.

- under the interpreter: with ``w2["PRE"]`` 1..6 the output, weights and ids are bit-equal to the plain w2 launch
  with the same tiles (ragged I, fewer K-blocks than PRE, k=1, no renormalisation, fp32/fp16), so is the one
  launch (``w2["ONE"]``, run twice: its tile counters are back at 0 after each launch), and the output
  agrees with a float64 loop (so the bit-equality is not two copies of one bug); the early o_proj GEMV gives
  ``cuda_fusions._gemv_kernel``'s bits for the same tile (PRE 1 / 3 / 8, ragged N and K);
- compiled for sm_90 by Triton's own compiler (no GPU): the routing's logits loads (``ld.global.cg``) and the w2
  loads of the first PRE blocks sit before ``griddepcontrol.wait``, and no load of the activations does;
- bad settings are refused with an error naming them.
The GPU side (bit-equal eager, in a graph and in a PDL chain whose logits come from the kernel just before) is
test_moe_w2_early_gpu.py.
"""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("triton")

_INTERP = r"""
import torch
from octavo.plugins.platforms.moe_decode_kernels import decode_one
g = torch.Generator().manual_seed(9)
for e, k, h, inter, dt, renorm in ((16, 4, 64, 96, torch.float16, True), (6, 3, 32, 40, torch.float16, False),
                                   (8, 2, 32, 200, torch.float32, True), (5, 1, 32, 24, torch.float16, True)):
    w13 = (torch.randn(e, 2 * inter, h, generator=g) * h ** -0.5).to(dt)
    w2 = (torch.randn(e, h, inter, generator=g) * inter ** -0.5).to(dt)
    x = torch.randn(1, h, generator=g).to(dt)
    logits = torch.randn(1, e, generator=g)
    tiles = {"w13": {"BLOCK_N": 16, "BLOCK_K": 32}, "w2": {"BLOCK_N": 8, "BLOCK_K": 16}}
    want = decode_one(x, logits, w13, w2, k, renorm, tiles)
    for pre in range(1, 7):
        got = decode_one(x, logits, w13, w2, k, renorm, {"w13": tiles["w13"], "w2": {**tiles["w2"], "PRE": pre}})
        for a, b in zip(want, got):
            assert torch.equal(a, b), (e, k, pre)
    for pre in (1, 4, 6):  # w13 and w2 in one launch (cuda_moe_one_launch.py), twice: the counters were reset
        for _ in range(2):
            one = decode_one(x, logits, w13, w2, k, renorm,
                             {"w13": tiles["w13"], "w2": {**tiles["w2"], "PRE": pre, "ONE": True}})
            for a, b in zip(want, one):
                assert torch.equal(a, b), (e, k, pre, "one")
    # float64 loop over the same routing: act = silu(x w1) * (x w3), out = sum_j w_j act_j w2_j
    wts, ids = want[1][0].double(), want[2][0]
    out = torch.zeros(h, dtype=torch.float64)
    for j in range(k):
        w1, w3 = w13[ids[j], :inter].double(), w13[ids[j], inter:].double()
        gate, up = w1 @ x[0].double(), w3 @ x[0].double()
        out += wts[j] * (w2[ids[j]].double() @ (torch.nn.functional.silu(gate) * up))
    err = float((got[0][0].double() - out).abs().max() / out.abs().max())
    assert err < (1e-5 if dt == torch.float32 else 2e-2), (e, k, err)
from octavo.plugins.platforms.cuda_moe_one_launch import _COUNTERS
assert all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())
# the o_proj GEMV with its first K-blocks loaded before the wait: cuda_fusions' GEMV bits for the same tile
from octavo.plugins.platforms.cuda_fusions import _gemv_kernel
from octavo.plugins.platforms.cuda_moe_oproj import gemv_early
for n, k, bn, bk in ((40, 96, 8, 32), (64, 256, 16, 32), (24, 40, 8, 16)):
    w = (torch.randn(n, k, generator=g) * k ** -0.5).half()
    x = torch.randn(1, k, generator=g).half()
    want = torch.empty(1, n, dtype=torch.float16)
    _gemv_kernel[(-(-n // bn),)](x, w, None, want, n, k, w.stride(0), HAS_BIAS=False, EVEN=False, BLOCK_N=bn,
                                 BLOCK_K=bk, PDL=False)
    for pre in (1, 3, 8):
        assert torch.equal(gemv_early(x, w, pre, bn, bk), want), (n, k, pre)
    ref = x.double() @ w.double().t()
    assert float((want.double() - ref).abs().max() / ref.abs().max()) < 2e-3
print("ok")
"""


def test_early_w2_gives_the_plain_launch_bits_in_the_interpreter():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(_INTERP)


def _ptx(pre: int) -> str:
    import triton
    from triton.backends.compiler import GPUTarget

    from octavo.plugins.platforms.cuda_moe_w2_early import _w2_early_kernel

    sig = {"act_ptr": "*bf16", "w2_ptr": "*bf16", "logits_ptr": "*bf16", "out_ptr": "*bf16", "num_experts": "i32",
           "N": "i32", "K": "i32", "stride_be": "i32", "stride_bn": "i32"}
    c = dict(TOP_K=8, K_P=8, E_P=128, RENORMALIZE=True, BLOCK_N=2, BLOCK_K=128, PRE=pre, PDL=True)
    src = triton.compiler.ASTSource(fn=_w2_early_kernel, signature={**sig, **{k: "constexpr" for k in c}},
                                    constexprs=c)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


@pytest.mark.parametrize("pre", [1, 4])
def test_sm90_build_loads_routing_and_weights_before_the_wait(pre):
    ptx = _ptx(pre)
    wait = ptx.find("griddepcontrol.wait")
    assert wait > 0
    before, after = ptx[:wait], ptx[wait:]
    assert "ld.global.cg" in before  # the router logits, through L2
    # the w2 rows of the first PRE blocks: [8, 2, 128] bf16 per block over 128 threads, vector loads
    n_before = len(re.findall(r"ld\.global(?!\.cg)[.\w]*", before))
    n_after = len(re.findall(r"ld\.global(?!\.cg)[.\w]*", after))
    assert n_before >= pre and n_after >= 1  # the activations (and the blocks past PRE) load after the wait
    assert "ld.global.cg" not in after


def test_bad_settings_are_refused():
    from octavo.plugins.platforms.moe_decode_kernels import decode_one

    x, logits = torch.zeros(1, 64), torch.zeros(1, 8)
    w13, w2 = torch.zeros(8, 64, 64), torch.zeros(8, 64, 32)
    tiles = {"BLOCK_N": 16, "BLOCK_K": 32}
    from octavo.plugins.platforms.cuda_moe_oproj import gemv_early

    for bad in (0, 9, True):
        with pytest.raises(ValueError, match="pre"):
            gemv_early(x, torch.zeros(8, 64), bad)
    for w13_extra, extra, what in [({}, {"PRE": 7}, "PRE"), ({}, {"PRE": 1.5}, "PRE"),
                                   ({}, {"PRE": 2, "PF_NEXT": 1}, "PF_NEXT"), ({}, {"ONE": True}, "PRE"),
                                   ({"ROUTE": "launch"}, {"ONE": True, "PRE": 2}, "ROUTE"),
                                   ({"PIPE": True}, {"ONE": True, "PRE": 2}, "PIPE")]:
        with pytest.raises(ValueError, match=what):
            decode_one(x, logits, w13, w2, 2, True, {"w13": {**tiles, **w13_extra}, "w2": {**tiles, **extra}})
