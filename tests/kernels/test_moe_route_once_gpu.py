"""Route once (``OCTAVO_MOE_ROUTE_ONCE=1``, session 11) on a CUDA GPU (skips without one): the norm + router launch's
last program (by ticket) computes the token's top-k, and the batch-1 w13 launch reads the ids instead of routing in
each of its programs.

1. At the Qwen3-30B-A3B layer shape, bf16, eager and replayed from a CUDA graph over 6 layers' launches in a row
   (each launch resets the shared ticket counter for the next): the ids and weights are the w13 launch's own
   routing bits, and the layer's output is bit-equal to the path that routes inside w13.
2. End to end: a tiny Qwen3-MoE checkpoint, bf16, CUDA graphs: the same greedy tokens and logprobs with route once
   on as off (the interpreter case is ``moe_decode_interp_cases.test_route_once_gives_the_in_kernel_routing_bits``).
"""

from __future__ import annotations

import gc
import random

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_route_once_bits_eager_and_in_a_graph_over_six_layers():
    from octavo.plugins.platforms.moe_decode_kernels import decode_one
    from octavo.plugins.platforms.moe_norm_router import _counter, norm_router
    from tests.kernels.moe_gpu_chain import LAYERS, E, H, K, assert_variant_bits, expert_weights

    w13, w2 = expert_weights()
    bf = torch.bfloat16
    gate = [(torch.randn(E, H, device="cuda") * H ** -0.5).to(bf) for _ in range(2)]
    nw = (1 + 0.1 * torch.randn(H, device="cuda")).to(bf)
    x0 = torch.randn(1, H, device="cuda").to(bf)
    res0 = torch.randn(1, H, device="cuda").to(bf)

    def chain(route_once):
        x, res, outs = x0, res0, []
        for i in range(LAYERS):
            if route_once:
                y, res, logits, w, ids = norm_router(x, res, nw, 1e-6, gate[i % 2], topk=(K, True))
                out, w_o, ids_o = decode_one(y, logits, w13[i % 2], w2[i % 2], K, True, routed=(w, ids))
            else:
                y, res, logits = norm_router(x, res, nw, 1e-6, gate[i % 2])
                out, w_o, ids_o = decode_one(y, logits, w13[i % 2], w2[i % 2], K, True)
            outs += [out, w_o, ids_o]
            x = out
        return outs

    def refill(gen):
        x0.copy_(torch.randn(1, H, device="cuda", generator=gen).to(bf))
        res0.copy_(torch.randn(1, H, device="cuda", generator=gen).to(bf))

    def check():
        assert int(_counter(x0.device)[0]) == 0

    assert_variant_bits(chain, False, True, refill, check)


def _tokens(path, prompts, route_once, monkeypatch):
    from octavo import LLM, SamplingParams

    monkeypatch.setenv("OCTAVO_MOE_ROUTE_ONCE", "1" if route_once else "0")
    llm = LLM(model=path, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=256, max_num_seqs=4,
              kv_cache_memory_bytes=64 << 20, enable_prefix_caching=False, seed=0)
    blocks = [m for m in llm.llm_engine.core.executor.driver.runner.model.modules() if "_moe_route_once" in vars(m)]
    on = sum(b._moe_route_once for b in blocks)
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=2, ignore_eos=True)
    outs = [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0].outputs[0] for p in prompts]
    res = [(o.token_ids, [sorted((t, lp.logprob) for t, lp in d.items()) for d in o.logprobs]) for o in outs]
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return res, on, len(blocks)


def test_tiny_qwen3_moe_same_tokens_with_route_once(tmp_path, monkeypatch):
    from tests.kernels.test_moe_gpu import _checkpoint

    path = _checkpoint(tmp_path, "Qwen3MoeForCausalLM")
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 9, 40)]
    monkeypatch.delenv("OCTAVO_MOE_TRITON", raising=False)
    off, n_off, blocks = _tokens(path, prompts, False, monkeypatch)
    on, n_on, _ = _tokens(path, prompts, True, monkeypatch)
    assert blocks == 2 and n_off == 0 and n_on == 2, (blocks, n_off, n_on)
    assert on == off
