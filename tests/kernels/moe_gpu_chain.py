"""What the batch-1 MoE GPU tests of a launch variant share (test_moe_route_once_gpu.py, test_moe_w2_early_gpu.py):
Qwen3-30B-A3B's layer shape and two layers' random bf16 expert weights, and the check that a chain of layers'
launches gives the same bits with the variant as without it, eager and replayed from CUDA graphs with new inputs."""

from __future__ import annotations

import torch

E, K, H, INTER, LAYERS = 128, 8, 2048, 768, 6  # experts, top-k, hidden, intermediate, layers in a chain


def expert_weights() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(w13, w2) for two layers (a chain alternates them), bf16, after ``torch.manual_seed(0)``; the caller's
    further draws follow in the same stream."""
    torch.manual_seed(0)
    bf = torch.bfloat16
    w13 = [(torch.randn(E, 2 * INTER, H, device="cuda") * H ** -0.5).to(bf) for _ in range(2)]
    w2 = [(torch.randn(E, H, INTER, device="cuda") * INTER ** -0.5).to(bf) for _ in range(2)]
    return w13, w2


def assert_variant_bits(chain, base, variant, refill, check) -> None:
    """``chain(cfg)`` (a list of output tensors) with ``variant`` equals it with ``base`` bit for bit, eager; then
    both chains captured in CUDA graphs (each run once outside its capture, so compiled) and replayed for seeds 0-2,
    ``refill(gen)`` copying new inputs into the graphs' input buffers first: equal again. ``check()`` (the shared
    flag / counter back at 0) after the eager runs and after each replay."""
    want, got = chain(base), chain(variant)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    check()
    graphs = {}
    for name, cfg in (("base", base), ("variant", variant)):
        chain(cfg)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            graphs[name] = (g, chain(cfg))
    for seed in range(3):
        refill(torch.Generator(device="cuda").manual_seed(seed))
        for g, _ in graphs.values():
            g.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(graphs["variant"][1], graphs["base"][1])), seed
        check()
    del graphs
    torch.cuda.empty_cache()
