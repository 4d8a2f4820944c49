"""The batch-1 w2 launch that routes itself and loads its first K-blocks before the PDL wait
(plugins/platforms/cuda_moe_w2_early.py) and the one-launch w13 + w2 (cuda_moe_one_launch.py) on a CUDA GPU
(skips without one): both must give the plain two-launch path's bits.

- At the Qwen3-30B-A3B (E=128, k=8) and Mixtral-8x7B (E=8, k=2) layer shapes, bf16, shipped-default tiles and
  ``w2["PRE"]`` 1 / 4 / 6 (Mixtral 2 / 4), and the one launch at PRE 2 and 4: output, weights and ids bit-equal to ``PRE`` 0, eager
  and replayed from a CUDA graph with new tokens and logits.
- A chain of layers captured in one graph where each layer's router logits come from the GEMV launched right
  before it (a PDL kernel when PDL is on), as in the model, so the early w2's read of the logits before its wait
  runs against a real producer chain; the chain's output must equal the plain path's after every replay.
(The o_proj / qkv GEMV that loads its first K-blocks before the wait: test_moe_gemv_early_gpu.py.)
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768), "mixtral-8x7b": (8, 2, 4096, 14336)}


def _weights(e, h, inter, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w13 = (torch.randn(e, 2 * inter, h, device="cuda", generator=gen) * h ** -0.5).bfloat16()
    w2 = (torch.randn(e, h, inter, device="cuda", generator=gen) * inter ** -0.5).bfloat16()
    return w13, w2


@pytest.mark.parametrize("shape", list(SHAPES))
def test_early_w2_is_bit_equal_eager_and_in_a_graph(shape):
    from octavo.plugins.platforms.moe_decode_kernels import decode_one, default_decode_config

    e, k, h, inter = SHAPES[shape]
    w13, w2 = _weights(e, h, inter, 3)
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(1, h, device="cuda", generator=gen).bfloat16()
    logits = torch.randn(1, e, device="cuda", generator=gen)
    base = default_decode_config(k, inter, h)
    pres = (1, 4, 6) if shape == "qwen3-30b-a3b" else (2, 4)
    cfgs = [{"w13": base["w13"], "w2": {**base["w2"], "PRE": p}} for p in pres]
    pres = (*pres, "one2", "one4")  # w13 and w2 in one launch (cuda_moe_one_launch.py)
    cfgs += [{"w13": base["w13"], "w2": {**base["w2"], "PRE": p, "ONE": True}} for p in (2, 4)]  # B9 variants

    def run():
        return [decode_one(x, logits, w13, w2, k, True, c) for c in [base, *cfgs]]

    outs = run()
    for p, got in zip(pres, outs[1:]):
        for a, b in zip(outs[0], got):
            assert torch.equal(a, b), p
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cap = run()
    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(10 + seed)
        x.copy_(torch.randn(1, h, device="cuda", generator=g).bfloat16())
        logits.copy_(torch.randn(1, e, device="cuda", generator=g))
        graph.replay()
        torch.cuda.synchronize()
        want = decode_one(x, logits, w13, w2, k, True, base)[0]
        assert torch.equal(cap[0][0], want), seed
        for p, got in zip(pres, cap[1:]):
            assert torch.equal(cap[0][0], got[0]), (seed, p)
    del graph


def test_early_w2_in_a_pdl_chain_whose_logits_come_from_the_kernel_before():
    from octavo.plugins.platforms.cuda_fusions import gemv
    from octavo.plugins.platforms.moe_decode_kernels import decode_one, default_decode_config

    e, k, h, inter = SHAPES["qwen3-30b-a3b"]
    layers = 6
    weights = [_weights(e, h, inter, 20 + i) for i in range(layers)]
    gen = torch.Generator(device="cuda").manual_seed(5)
    gates = [(torch.randn(e, h, device="cuda", generator=gen) * h ** -0.5).bfloat16() for _ in range(layers)]
    x0 = torch.randn(1, h, device="cuda", generator=gen).bfloat16()
    base = default_decode_config(k, inter, h)
    early = {"w13": base["w13"], "w2": {**base["w2"], "PRE": 4}}
    one = {"w13": base["w13"], "w2": {**base["w2"], "PRE": 2, "ONE": True}}

    def chain(cfg):
        x = x0
        for (w13, w2), gate in zip(weights, gates):
            logits = gemv(x, gate)  # the router GEMV: the producer just before the w13 launch
            out = decode_one(x, logits, w13, w2, k, True, cfg)[0]
            x = (x.float() + out.float() * 4).bfloat16()  # keep the scale: the next layer routes on new values
        return x

    want_eager = chain(base)
    assert torch.equal(chain(early), want_eager)
    assert torch.equal(chain(one), want_eager)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        want, got, got_one = chain(base), chain(early), chain(one)
    for seed in range(5):
        x0.copy_(torch.randn(1, h, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
                 .bfloat16())
        for _ in range(4):  # back-to-back replays: the next replay's first kernels overlap nothing stale
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(want, got), seed
        assert torch.equal(want, got_one), seed
        assert torch.equal(want, chain(base)), seed
    del graph
