"""Cases for the batch-1 MoE path under Triton's CPU interpreter: the two-launch decode kernels
(``moe_decode_kernels.py``: routing fused into w13, the weighted sum into w2) and the post-attention norm + router
launch (``moe_norm_router.py``), against a float64 oracle, the general kernel and the torch path.

Not collected directly (no ``test_`` prefix): ``test_moe_triton_cpu.py`` runs this file with pytest in a child process
with ``TRITON_INTERPRET=1``, which must be set before any ``@triton.jit`` is defined.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

assert os.environ.get("TRITON_INTERPRET") == "1", "run through test_moe_triton_cpu.py"

from octavo.nn.fused_moe import FusedMoE  # noqa: E402
from octavo.plugins.platforms import cuda_moe  # noqa: E402
from octavo.plugins.platforms.cuda_moe_kernels import fused_experts, topk_softmax  # noqa: E402
from tests.kernels.moe_oracle import INTER, SMALL, E, H, K, _layer, _reference, _weights  # noqa: E402


@pytest.mark.parametrize("dtype,num_experts,top_k,hidden,inter,renormalize,tiles", [
    (torch.bfloat16, E, K, H, INTER, True, (32, 32, 16, 64)),
    (torch.float16, 6, 3, 40, 72, False, (16, 32, 16, 32)),  # H and I not multiples of the tiles
    (torch.float32, 16, 4, H, 48, True, (16, 16, 8, 16)),
    (torch.bfloat16, 128, 8, H, 32, True, (16, 64, 8, 32))])  # Qwen3-30B-A3B's routing width
def test_batch_one_two_launch_path_matches_float64(dtype, num_experts, top_k, hidden, inter, renormalize, tiles):
    """Routing fused into the w13 GEMV and the weighted sum over k into the w2 GEMV, against torch's routing and
    a float64 loop; the routing it returns is ``topk_softmax``'s."""
    from octavo.plugins.platforms.moe_decode_kernels import decode_one

    bn13, bk13, bn2, bk2 = tiles
    layer = FusedMoE(num_experts, top_k, hidden, inter, renormalize=renormalize)
    w13, w2 = _weights(dtype, num_experts, hidden, inter)
    for seed in range(2):
        gen = torch.Generator().manual_seed(20 + seed)
        x = torch.randn(1, hidden, generator=gen).to(dtype)
        logits = torch.randn(1, num_experts, generator=gen).to(dtype if dtype != torch.bfloat16 else torch.float32)
        got, got_w, got_ids = decode_one(x, logits, w13, w2, top_k, renormalize,
                                         {"w13": {"BLOCK_N": bn13, "BLOCK_K": bk13}, "w2": {"BLOCK_N": bn2, "BLOCK_K": bk2}})
        want_w, want_ids = layer.select_experts(logits)
        assert torch.equal(got_ids, want_ids) and got_ids.dtype == torch.int64
        assert (got_w - want_w).abs().max() <= 1e-6
        want = _reference(x, w13, w2, want_w, want_ids)
        tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 3e-2}[dtype]
        assert got.shape == (1, hidden) and (got.double() - want).abs().max() <= tol * want.abs().max()


def test_batch_one_two_launch_path_equals_general_kernel_to_an_ulp():
    """Same rounding steps as the general kernel (gate/up, silu, product, GEMV, weight): only the order of the
    fp32 sums differs, so the two agree to one ulp of the output."""
    from octavo.plugins.platforms.moe_decode_kernels import decode_one

    w13, w2 = _weights(torch.float16)
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(9)).to(torch.float16)
    logits = torch.randn(1, E, generator=torch.Generator().manual_seed(10))
    got = decode_one(x, logits, w13, w2, K, True, {"w13": {"BLOCK_N": 32, "BLOCK_K": 32},
                                                     "w2": {"BLOCK_N": 16, "BLOCK_K": 64}})[0].float()
    w, ids = topk_softmax(logits, K, True)
    want = fused_experts(x, w13, w2, w, ids, SMALL).float()
    assert ((got - want).abs() <= 2 ** -10 * want.abs() + 1e-6).all()


@pytest.mark.parametrize("num_experts,top_k,inter", [(E, K, INTER), (6, 3, 40)])
def test_batch_one_w13_all_slots_variant(num_experts, top_k, inter):
    """``"ALL_SLOTS": true``: each w13 program covers every slot's rows (k not a power of two, I not a multiple
    of BLOCK_N): the same routing, float64 agreement, and the per-slot variant's output to an ulp."""
    from octavo.plugins.platforms.moe_decode_kernels import decode_one

    w13, w2 = _weights(torch.float16, num_experts, H, inter)
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(17)).to(torch.float16)
    logits = torch.randn(1, num_experts, generator=torch.Generator().manual_seed(18))
    w2_tiles = {"BLOCK_N": 8, "BLOCK_K": 32}
    got, got_w, got_ids = decode_one(x, logits, w13, w2, top_k, True, {
        "w13": {"BLOCK_N": 16, "BLOCK_K": 32, "ALL_SLOTS": True}, "w2": w2_tiles})
    per_slot, want_w, want_ids = decode_one(x, logits, w13, w2, top_k, True, {
        "w13": {"BLOCK_N": 16, "BLOCK_K": 32}, "w2": w2_tiles})
    assert torch.equal(got_ids, want_ids) and torch.equal(got_w, want_w)
    want = _reference(x, w13, w2, want_w, want_ids)
    assert (got.double() - want).abs().max() <= 2e-3 * want.abs().max()
    assert ((got.float() - per_slot.float()).abs() <= 2 ** -10 * per_slot.float().abs() + 1e-6).all()


def test_batch_one_two_launch_path_breaks_ties_like_the_routing_kernel():
    """Equal probabilities: the lowest expert wins, as in ``topk_softmax`` (one packed-key reduction per round
    instead of max-then-min); here every logit ties, or pairs of them do."""
    from octavo.plugins.platforms.moe_decode_kernels import decode_one

    w13, w2 = _weights(torch.float16, 16, H, 32)
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(13)).to(torch.float16)
    for logits in (torch.zeros(1, 16), torch.tensor([[0.5, 1, 1, 0.5, 2, 2, 0, 0, 3, 3, 1, 1, 2, 2, 0.5, 3]])):
        _, got_w, got_ids = decode_one(x, logits, w13, w2, 5, False, {"w13": {"BLOCK_N": 32, "BLOCK_K": 64},
                                                                      "w2": {"BLOCK_N": 32, "BLOCK_K": 32}})
        want_w, want_ids = topk_softmax(logits, 5, False)
        assert torch.equal(got_ids, want_ids) and torch.equal(got_w, want_w)


def test_installed_layer_runs_batch_one_in_two_launches(monkeypatch):
    """One token goes through the two-launch path (checked at install), more tokens through the general
    kernel; ``OCTAVO_MOE_FUSED_DECODE=0`` keeps the general kernel at batch 1."""
    dt = torch.float16  # the interpreter rounds float32 -> bfloat16 toward zero (see the norm + router case)
    layer = _layer(dt)
    x1 = torch.randn(1, H, generator=torch.Generator().manual_seed(11)).to(dt)
    x3 = torch.randn(3, H, generator=torch.Generator().manual_seed(12)).to(dt)
    logits1, logits3 = torch.randn(1, E), torch.randn(3, E)
    want1, want3 = layer(x1, logits1).float(), layer(x3, logits3).float()
    notes = cuda_moe.install_moe_kernels(layer, dt, torch.device("cpu"))
    assert notes["triton"] == 1 and notes["decode_one"] == 1 and "forward" in layer.__dict__
    calls = []
    real = layer._moe_decode
    layer._moe_decode = lambda *a: calls.append(1) or real(*a)
    got1, got3 = layer(x1, logits1).float(), layer(x3, logits3).float()
    assert calls == [1]
    assert (got1 - want1).abs().max() <= 5e-3 * want1.abs().max()
    assert (got3 - want3).abs().max() <= 5e-3 * want3.abs().max()
    monkeypatch.setenv("OCTAVO_MOE_FUSED_DECODE", "0")
    layer = _layer(torch.bfloat16)
    cuda_moe.use_triton_kernel(layer)  # what install_moe_kernels does per layer, without its interpreted checks
    assert layer._moe_decode is None and "forward" not in layer.__dict__ and "apply_experts" in layer.__dict__


def test_a_wrong_batch_one_path_is_refused_at_install(monkeypatch):
    """The install check can fail: a batch-1 path off by a little keeps the general kernel (routing kernel
    included) for that shape, with the decode path off."""
    from octavo.plugins.platforms import moe_decode_kernels

    real = moe_decode_kernels.decode_one

    def off_by_a_bit(*a):
        out, w, ids = real(*a)
        return out * 1.1, w, ids

    monkeypatch.setattr(moe_decode_kernels, "decode_one", off_by_a_bit)
    layer = _layer(torch.float16)
    notes = cuda_moe.install_moe_kernels(layer, torch.float16, torch.device("cpu"))
    assert notes["triton"] == 1 and notes["decode_one"] == 0
    assert "forward" not in layer.__dict__ and "apply_experts" in layer.__dict__


def _qwen3_moe_layer(dtype):
    """A real Qwen3-MoE decoder layer (E=16, k=4, H=64), random weights, its post-attention norm on the fused
    RMSNorm kernel as ``cuda_fusions`` installs it."""
    import types

    import transformers as T

    from octavo.plugins.models.qwen3 import Qwen3DecoderLayer
    from octavo.plugins.platforms.cuda_fusions import _fused_rms_forward

    cfg = T.Qwen3MoeConfig(vocab_size=64, hidden_size=H, num_hidden_layers=1, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, num_experts=16, num_experts_per_tok=4,
                           moe_intermediate_size=32, norm_topk_prob=True, intermediate_size=64)
    layer = Qwen3DecoderLayer(cfg, 0, prefix="model.layers.0")
    gen = torch.Generator().manual_seed(14)
    for p in layer.parameters():
        p.data = (torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5).to(dtype)
    norm = layer.post_attention_layernorm
    norm.weight.data = (1 + 0.1 * torch.randn(H, generator=gen)).to(dtype)
    norm.forward = types.MethodType(_fused_rms_forward, norm)
    return layer, norm, layer.mlp


def test_norm_router_kernel_matches_fused_norm_and_router():
    """Norm (with residual) + router GEMV in one launch: the row and residual bit-equal to the fused RMSNorm
    kernel's, the logits within an ulp of the router linear's (E=16 over 4-row programs, H=64 in 32-wide chunks)."""
    from octavo.plugins.platforms.cuda_fusions import rms_norm
    from octavo.plugins.platforms.moe_norm_router import norm_router

    _, norm, block = _qwen3_moe_layer(torch.bfloat16)
    gen = torch.Generator().manual_seed(15)
    x, res = (torch.randn(1, H, generator=gen).to(torch.bfloat16) for _ in range(2))
    out, res_out, logits = norm_router(x, res, norm.weight, norm.eps, block.gate.weight, rows=4)
    want_out, want_res = rms_norm(x, norm.weight, norm.eps, res)
    assert torch.equal(out, want_out) and torch.equal(res_out, want_res)
    want = F.linear(want_out.float(), block.gate.weight.float())
    assert logits.dtype == torch.bfloat16 and (logits.float() - want).abs().max() <= 1e-2 * want.abs().max()


def test_norm_router_installed_on_a_qwen3_moe_layer(monkeypatch):
    """Installed by ``install_moe_kernels`` on a real decoder layer: one token's norm hands its logits to the
    block, which gives the unfused pair's output; a tensor other than the norm's output, or a larger batch,
    takes the router linear; with ``OCTAVO_MOE_NORM_ROUTER=0`` the pair stays apart (unset: fused, the default);
    the A/B switch restores it."""
    from octavo.plugins.platforms.moe_norm_router import install_norm_router, set_norm_router

    # float16: Triton's interpreter rounds float32 -> bfloat16 toward zero (the GPU to nearest), which puts the
    # bf16 kernels' error vs the torch path right at the install check's bound here
    dt = torch.float16
    monkeypatch.delenv("OCTAVO_MOE_NORM_ROUTER", raising=False)  # on by default
    layer, norm, block = _qwen3_moe_layer(dt)
    gen = torch.Generator().manual_seed(16)
    x, res = (torch.randn(1, H, generator=gen).to(dt) for _ in range(2))
    want_out, want_res = norm(x, res)
    want = block(want_out).float()
    notes = cuda_moe.install_moe_kernels(layer, dt, torch.device("cpu"))
    assert notes["decode_one"] == 1 and notes["norm_router"] == 1 and "forward" in vars(block)
    gate_calls = []
    real_gate = block.gate.forward  # counted by an instance forward: a forward hook turns the fusion off (below)
    block.gate.forward = lambda *a, **k: gate_calls.append(1) or real_gate(*a, **k)
    out, res_out = norm(x, res)
    assert torch.equal(out, want_out) and torch.equal(res_out, want_res) and block._moe_pre[0] is out
    got = block(out).float()
    assert gate_calls == [] and block._moe_pre is None
    assert (got - want).abs().max() <= 5e-3 * want.abs().max()
    assert (block(out.clone()).float() - got).abs().max() <= 5e-3 * want.abs().max() and gate_calls == [1]
    x3, res3 = (torch.randn(3, H, generator=gen).to(dt) for _ in range(2))
    out3, _ = norm(x3, res3)
    block(out3)
    assert gate_calls == [1, 1]
    hook = block.gate.register_forward_hook(lambda mod, args, y: y)  # LoRA adds its delta in such a hook
    norm(x, res)
    assert block._moe_pre is None  # so the norm hands no logits and the block calls the hooked router
    hook.remove()
    del block.gate.forward  # the counter: install refuses a router with an instance forward
    set_norm_router(norm, block, False)
    assert "forward" not in vars(block) and norm.forward.__func__.__name__ == "_fused_rms_forward"
    monkeypatch.setenv("OCTAVO_MOE_NORM_ROUTER", "0")
    assert install_norm_router(layer) == [] and "forward" not in vars(block)
    monkeypatch.delenv("OCTAVO_MOE_NORM_ROUTER")
    assert len(install_norm_router(layer)) == 1 and "forward" in vars(block)  # unset: the default, fused


def test_route_once_gives_the_in_kernel_routing_bits(monkeypatch):
    """``OCTAVO_MOE_ROUTE_ONCE=1``: the norm + router launch's last program (by ticket) routes the token and w13
    reads its ids. The launch's weights and ids equal the w13 launch's own routing of the same logits, the block's
    output is bit-equal to the path that routes in w13, the ticket counter is back at 0 after each launch, and a
    block whose experts cannot take ids is refused by name."""
    from octavo.plugins.platforms.moe_decode_kernels import decode_one
    from octavo.plugins.platforms.moe_norm_router import _counter, norm_router, set_norm_router

    dt = torch.float16
    layer, norm, block = _qwen3_moe_layer(dt)
    gen = torch.Generator().manual_seed(17)
    x, res = (torch.randn(1, H, generator=gen).to(dt) for _ in range(2))
    ex = block.experts
    _, _, logits, w, ids = norm_router(x, res, norm.weight, norm.eps, block.gate.weight, rows=4,
                                       topk=(ex.top_k, ex.renormalize))
    assert int(_counter(x.device)[0]) == 0
    _, want_w, want_ids = decode_one(x, logits, ex.w13_weight, ex.w2_weight, ex.top_k, ex.renormalize)
    assert torch.equal(ids, want_ids) and torch.equal(w, want_w)
    monkeypatch.setenv("OCTAVO_MOE_ROUTE_ONCE", "1")
    notes = cuda_moe.install_moe_kernels(layer, dt, torch.device("cpu"))
    assert notes["norm_router"] == 1 and block._moe_route_once
    out, _ = norm(x, res)
    assert block._moe_pre[2] is not None
    got = block(out)
    assert "_moe_routed" not in vars(ex)  # consumed by the experts' forward
    set_norm_router(norm, block, True, route_once=False)
    out2, _ = norm(x, res)
    assert block._moe_pre[2] is None and torch.equal(out2, out)
    assert torch.equal(block(out2), got)  # routing in each w13 program: the same bits
    assert int(_counter(x.device)[0]) == 0
    ex._moe_decode_cfg = {**ex._moe_decode_cfg, "w13": {**ex._moe_decode_cfg["w13"], "ROUTE": "launch"}}
    with pytest.raises(ValueError, match="OCTAVO_MOE_ROUTE_ONCE"):
        set_norm_router(norm, block, True, route_once=True)


def test_w13_dot_tiles_route_and_sum_like_the_plain_kernel():
    """``"DOT": true`` (moe_w13_dot.py): the same routing bits, in-kernel or from given ids, and the layer's output
    within fp16 rounding of the plain-load w13's (another sum order: the tensor cores' on a GPU); a tile that does not
    divide the shape is refused by name."""
    from octavo.plugins.platforms.moe_decode_kernels import decode_one

    dt, (e, k, h, inter) = torch.float16, (16, 4, 64, 32)
    g = torch.Generator().manual_seed(18)
    w13 = (torch.randn(e, 2 * inter, h, generator=g) * h ** -0.5).to(dt)
    w2 = (torch.randn(e, h, inter, generator=g) * inter ** -0.5).to(dt)
    x = torch.randn(1, h, generator=g).to(dt)
    logits = torch.randn(1, e, generator=g)
    cfg = {"w13": {"BLOCK_N": 16, "BLOCK_K": 32}, "w2": {"BLOCK_N": 4, "BLOCK_K": 32}}
    want, want_w, want_ids = decode_one(x, logits, w13, w2, k, True, cfg)
    dot = {"w13": {**cfg["w13"], "DOT": True}, "w2": cfg["w2"]}
    for routed in (None, (want_w, want_ids)):
        out, w, ids = decode_one(x, logits, w13, w2, k, True, dot, routed=routed)
        assert torch.equal(ids, want_ids) and torch.equal(w, want_w)
        assert (out.float() - want.float()).abs().max() <= 2e-3 * want.float().abs().max()
    with pytest.raises(ValueError, match="DOT"):
        decode_one(x, logits, w13, w2, k, True, {"w13": {"BLOCK_N": 16, "BLOCK_K": 48, "DOT": True}, "w2": cfg["w2"]})


def test_early_w2_gives_the_plain_w2_bits():
    """``w2["EARLY"]`` (moe_w2_early.py): w13's program 0 releases a flag after the ids, each w2 program polls it and
    loads PRE K-blocks before its wait; the output is bit-equal to the plain w2 launch's for PRE 1 / 2 / 3 / 6 (more
    than the 3 blocks there are), repeatedly (the last w2 program resets the flag and the ticket); bad PRE refused."""
    from octavo.plugins.platforms.moe_decode_kernels import decode_one
    from octavo.plugins.platforms.moe_w2_early import flags

    dt, (e, k, h, inter) = torch.float16, (16, 4, 64, 96)
    g = torch.Generator().manual_seed(19)
    w13 = (torch.randn(e, 2 * inter, h, generator=g) * h ** -0.5).to(dt)
    w2 = (torch.randn(e, h, inter, generator=g) * inter ** -0.5).to(dt)
    cfg = {"w13": {"BLOCK_N": 16, "BLOCK_K": 32}, "w2": {"BLOCK_N": 4, "BLOCK_K": 32}}
    for _ in range(2):
        x, logits = torch.randn(1, h, generator=g).to(dt), torch.randn(1, e, generator=g)
        want = decode_one(x, logits, w13, w2, k, True, cfg)
        for pre in (1, 2, 3, 6):
            got = decode_one(x, logits, w13, w2, k, True, {"w13": cfg["w13"], "w2": {**cfg["w2"], "EARLY": pre}})
            assert all(torch.equal(a, b) for a, b in zip(got, want)), pre
            assert flags(x.device).tolist() == [0, 0]
    for bad in (7, True, 1.5):
        with pytest.raises(ValueError, match="EARLY"):
            decode_one(x, logits, w13, w2, k, True, {"w13": cfg["w13"], "w2": {**cfg["w2"], "EARLY": bad}})


def test_partial_routing_gives_the_same_ids_and_output():
    """w13 ``ROUTE`` "partial" (a slot-s program runs s + 1 max rounds, program 0 all k): the same ids, weights and
    output bits as the full in-kernel routing, ties included (equal logits: the lowest expert wins either way)."""
    from octavo.plugins.platforms.moe_decode_kernels import decode_one

    dt, (e, k, h, inter) = torch.float16, (16, 4, 64, 32)
    g = torch.Generator().manual_seed(20)
    w13 = (torch.randn(e, 2 * inter, h, generator=g) * h ** -0.5).to(dt)
    w2 = (torch.randn(e, h, inter, generator=g) * inter ** -0.5).to(dt)
    cfg = {"w13": {"BLOCK_N": 16, "BLOCK_K": 32}, "w2": {"BLOCK_N": 4, "BLOCK_K": 32}}
    x = torch.randn(1, h, generator=g).to(dt)
    for logits in (torch.randn(1, e, generator=g), torch.zeros(1, e), torch.tensor([[1.0, 3.0, 3.0, 2.0] * 4])):
        want = decode_one(x, logits, w13, w2, k, True, cfg)
        got = decode_one(x, logits, w13, w2, k, True, {"w13": {**cfg["w13"], "ROUTE": "partial"}, "w2": cfg["w2"]})
        assert all(torch.equal(a, b) for a, b in zip(got, want))
