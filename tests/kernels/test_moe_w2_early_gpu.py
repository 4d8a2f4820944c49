"""The early w2 launch (``w2["EARLY"]``, plugins/platforms/moe_w2_early.py, session 11) and w13's partial routing
(session 12) on a CUDA GPU (skips without one): at the Qwen3-30B-A3B layer shape, bf16, PRE 1 / 2 / 6, partial routing
alone and with PRE 2, a chain of 6 layers' two expert launches (each w2 resets the shared flag and ticket for the
next), eager and replayed from a CUDA graph with new inputs: the same output bits as the plain launches, the flag
back at 0. The interpreter cases are in moe_decode_interp_cases.py."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("pre", [1, 2, 6])
def test_early_w2_bits_over_six_layers_eager_and_in_a_graph(pre):
    _assert_chain_bits({}, {"EARLY": pre})


# session 12: w13's partial routing (slot s: s + 1 max rounds; program 0 all k and stores them), alone and beside
# the early w2 that reads program 0's ids: the candidate defaults of the H100 decode config
@pytest.mark.parametrize("w13_extra,w2_extra", [({"ROUTE": "partial"}, {}), ({"ROUTE": "partial"}, {"EARLY": 2})],
                         ids=["partial", "partial+early2"])
def test_partial_routing_bits_over_six_layers_eager_and_in_a_graph(w13_extra, w2_extra):
    _assert_chain_bits(w13_extra, w2_extra)


def _assert_chain_bits(w13_extra: dict, w2_extra: dict) -> None:
    from octavo.plugins.platforms.moe_decode_kernels import decode_one
    from octavo.plugins.platforms.moe_w2_early import flags
    from tests.kernels.moe_gpu_chain import LAYERS, E, H, K, assert_variant_bits, expert_weights

    w13, w2 = expert_weights()
    bf = torch.bfloat16
    x0 = torch.randn(1, H, device="cuda").to(bf)
    lg = torch.randn(LAYERS, E, device="cuda")
    base = {"w13": {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4}, "w2": {"BLOCK_N": 2, "BLOCK_K": 128, "num_warps": 4}}
    early = {"w13": {**base["w13"], **w13_extra}, "w2": {**base["w2"], **w2_extra}}

    def chain(cfg):
        x, outs = x0, []
        for i in range(LAYERS):
            out, w, ids = decode_one(x, lg[i:i + 1], w13[i % 2], w2[i % 2], K, True, cfg)
            outs += [out, w, ids]
            x = out
        return outs

    def refill(gen):
        x0.copy_(torch.randn(1, H, device="cuda", generator=gen).to(bf))
        lg.copy_(torch.randn(LAYERS, E, device="cuda", generator=gen))

    def check():
        assert flags(x0.device).tolist() == [0, 0]

    assert_variant_bits(chain, base, early, refill, check)
