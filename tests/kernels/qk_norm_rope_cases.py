"""Cases for the fused Qwen3 q/k RMSNorm + rotary kernel (``plugins/platforms/cuda_qk_norm_rope.py``).

Not collected directly: ``test_fused_sampler_cpu.py`` runs this file under ``TRITON_INTERPRET=1`` on CPU; on a
CUDA machine run it directly (`NANO_PART=s5a bash benchmarks/device/nano7.sh` does). The reference is the eager ``octavo.nn`` layers
(RMSNorm per head on the strided q/k slices of the qkv output, then RotaryEmbedding).
"""

from __future__ import annotations

import os
import types

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("needs CUDA or TRITON_INTERPRET=1 (run through test_fused_sampler_cpu.py)", allow_module_level=True)

from octavo.nn.layernorm import RMSNorm  # noqa: E402
from octavo.nn.rotary import RotaryEmbedding, compute_cos_sin  # noqa: E402
from octavo.plugins.platforms.cuda_qk_norm_rope import _verify, close, fuse_qk_norm_rope, qk_norm_rope  # noqa: E402

DEV = torch.device("cpu" if INTERPRET else "cuda")
DTYPES = (torch.float32, torch.bfloat16) if INTERPRET else (torch.bfloat16, torch.float16)


def _attn(head, rot, neox, hq, hk, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    cos, sin = compute_cos_sin(rot, 1024, 10000.0)
    a = types.SimpleNamespace(head_dim=head, num_heads=hq, num_kv_heads=hk, q_size=hq * head, kv_size=hk * head,
                              rotary_emb=RotaryEmbedding(head, rot, cos, sin, is_neox_style=neox).to(DEV),
                              q_norm=RMSNorm(head, eps=1e-6).to(DEV), k_norm=RMSNorm(head, eps=1e-6).to(DEV))
    a.q_norm.weight.data = (torch.rand(head, generator=gen) + 0.5).to(DEV, dtype)
    a.k_norm.weight.data = (torch.rand(head, generator=gen) + 0.5).to(DEV, dtype)
    return a


@pytest.mark.parametrize("head,rot,neox,hq,hk", [(128, 128, True, 16, 8), (64, 64, False, 4, 1), (80, 40, True, 6, 2)])
def test_matches_eager_norms_and_rotary(head, rot, neox, hq, hk):
    for dtype in DTYPES:
        a = _attn(head, rot, neox, hq, hk, dtype)
        assert _verify(a, dtype, DEV, torch.Generator(device=DEV).manual_seed(1))
        # large positions and a strided qkv (the GEMM output's columns): the kernel reads the slices in place
        n = 5
        qkv = torch.randn(n, a.q_size + 2 * a.kv_size + 8, device=DEV).to(dtype)[:, 4:-4]
        pos = torch.tensor([0, 1, 511, 1000, 1023], device=DEV)
        q, k, _ = qkv.split([a.q_size, a.kv_size, a.kv_size], -1)
        want = a.rotary_emb(pos, a.q_norm(q.reshape(n, hq, head)).reshape(n, -1),
                            a.k_norm(k.reshape(n, hk, head)).reshape(n, -1))
        got = qk_norm_rope(a, pos, qkv)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and close(g, w), (g.float() - w.float()).abs().max()
            if dtype == torch.float32:
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_installs_on_qwen3_attention_and_the_forward_matches():
    from transformers import Qwen3Config

    from octavo.plugins.models.qwen3 import Qwen3Attention

    cfg = Qwen3Config(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      intermediate_size=256, num_hidden_layers=1, vocab_size=100, max_position_embeddings=512,
                      rms_norm_eps=1e-6)
    dtype = DTYPES[-1]
    attn = Qwen3Attention(cfg, 0).to(DEV, dtype)
    for p in attn.parameters():
        p.data = (torch.rand_like(p, dtype=torch.float32) - 0.5).to(dtype) * 0.2
    calls = []

    class Probe(torch.nn.Module):  # stands in for the paged attention: records q, k, v; returns q
        def forward(self, q, k, v, ctx):
            calls.append((q, k, v))
            return q

    attn.attn = Probe()
    x, pos = torch.randn(3, 128, device=DEV).to(dtype), torch.tensor([3, 9, 200], device=DEV)
    want = attn(pos, x, None)
    eager_qkv = calls.pop()
    assert fuse_qk_norm_rope(attn, dtype, DEV) == {"QKNormRope": 1}
    got = attn(pos, x, None)
    fused_qkv = calls.pop()
    for g, w in zip(fused_qkv, eager_qkv):
        assert g.shape == w.shape and close(g, w)
    torch.testing.assert_close(fused_qkv[2], eager_qkv[2], rtol=0, atol=0)  # v passes through untouched
    assert close(got, want)
    os.environ["OCTAVO_FUSE_QK_NORM_ROPE"] = "0"
    try:
        assert fuse_qk_norm_rope(Qwen3Attention(cfg, 0).to(DEV, dtype), dtype, DEV) == {}
    finally:
        del os.environ["OCTAVO_FUSE_QK_NORM_ROPE"]
