"""Fused RMSNorm / rotary / SiLU-and-mul kernels agree with the eager ``octavo.nn`` layers they replace."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def _dtypes(device):
    return (torch.bfloat16, torch.float16) if device.type == "cuda" else (torch.float16, torch.float32)


def test_rms_norm(device):
    from octavo.nn.layernorm import RMSNorm
    from octavo.plugins.platforms.cuda_fusions import _close, fuse_model

    for dtype in _dtypes(device):
        for d in (64, 1000, 4096):
            norm = RMSNorm(d, eps=1e-5).to(device)
            norm.weight.data = (torch.rand(d, device=device) + 0.5).to(dtype)
            x, r = torch.randn(9, d, device=device).to(dtype), torch.randn(9, d, device=device).to(dtype)
            want_plain, want_res = norm(x), norm(x, r)
            assert fuse_model(norm, dtype, device)["RMSNorm"] == 1
            assert _close(norm(x), want_plain) and _close(norm(x, r), want_res)
            assert torch.equal(norm(x, r)[1], x + r)  # the residual stream is bit-exact


def test_silu_and_mul(device):
    from octavo.nn.activation import SiluAndMul
    from octavo.plugins.platforms.cuda_fusions import _close, fuse_model

    for dtype in _dtypes(device):
        act = SiluAndMul()
        x = torch.randn(5, 2 * 3000, device=device).to(dtype)
        want = act(x)
        assert fuse_model(act, dtype, device)["SiluAndMul"] == 1
        assert _close(act(x), want)


@pytest.mark.parametrize("neox,head,rot", [(True, 128, 128), (False, 64, 64), (True, 80, 40)])
def test_rotary(device, neox, head, rot):
    from octavo.nn.rotary import RotaryEmbedding, compute_cos_sin
    from octavo.plugins.platforms.cuda_fusions import _close, fuse_model

    for dtype in _dtypes(device):
        cos, sin = compute_cos_sin(rot, 4096, 10000.0)
        rope = RotaryEmbedding(head, rot, cos, sin, is_neox_style=neox).to(device)
        pos = torch.randint(0, 4096, (11,), device=device)
        eager = rope.forward
        for kv_heads in (2, 1):  # GQA and MQA
            qkv = torch.randn(11, (6 + 2 * kv_heads) * head, device=device).to(dtype)
            q, k, _ = qkv.split([6 * head, kv_heads * head, kv_heads * head], -1)  # strided views, as in models
            want = eager(pos, q, k)
            assert fuse_model(rope, dtype, device)["RotaryEmbedding"] == 1
            assert _close(rope(pos, q, k), want)


@pytest.mark.parametrize("n,k,bias", [(1000, 300, True), (256, 1024, False), (192, 2048, True)])
def test_gemv_linear_method(device, n, k, bias):
    from octavo.nn.linear import ReplicatedLinear
    from octavo.plugins.platforms.cuda_fusions import _close, fuse_model

    for dtype in _dtypes(device):
        with torch.device(device):
            torch.set_default_dtype(dtype)
            try:
                layer = ReplicatedLinear(k, n, bias=bias)
            finally:
                torch.set_default_dtype(torch.float32)
        layer.weight.data.normal_(0, 0.05)
        if bias:
            layer.bias.data.normal_()
        x1, x3 = torch.randn(1, k, device=device).to(dtype), torch.randn(3, k, device=device).to(dtype)
        want1, want3 = layer(x1), layer(x3)
        assert fuse_model(layer, dtype, device)["Linear(gemv)"] == (1 if dtype != torch.float32 else 0)
        assert _close(layer(x1), want1)
        assert torch.equal(layer(x3), want3)  # wider inputs stay on F.linear
