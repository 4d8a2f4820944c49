"""The ``triton`` backend's kernels against a float64 dense reference: prefill, chunked prefill over cached
prefixes, decode (with and without split-KV), GQA/MQA, block sizes, head sizes, windows, soft-capping."""

import math

import pytest
import torch

from tests.gpu.paged_reference import make_case, reference, rel_err

pytestmark = pytest.mark.gpu

TOL = {torch.float16: 6e-3, torch.bfloat16: 2e-2, torch.float32: 2e-5}


def run_backend(case, num_heads, num_kv_heads, head_size, dtype, device, splits=None, **kw):
    from octavo.plugins.attention.triton import TritonAttentionBackend

    be = TritonAttentionBackend(num_heads=num_heads, head_size=head_size, num_kv_heads=num_kv_heads,
                                scale=head_size**-0.5, **kw)
    if splits is not None:
        be._num_splits = lambda md, block_n, dev: splits
    md = TritonAttentionBackend.build_metadata(case.layout, device)
    out = be.forward(case.query, case.key, case.value, case.kv_cache, md)
    return out


def check(seqs, num_heads=4, num_kv_heads=2, head_size=64, block_size=16, dtype=torch.float16, device=None,
          splits=None, sliding_window=None, logits_soft_cap=None, seed=0):
    case = make_case(seqs, num_heads, num_kv_heads, head_size, block_size, dtype, device, seed=seed)
    out = run_backend(case, num_heads, num_kv_heads, head_size, dtype, device, splits,
                      sliding_window=sliding_window, logits_soft_cap=logits_soft_cap)
    assert out.shape == case.query.shape and out.dtype == dtype
    assert torch.isfinite(out).all(), "non-finite output"
    ref = reference(case, head_size**-0.5, sliding_window, logits_soft_cap)
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"relative error {err:.2e} for {seqs}"
    # the new K/V must sit at their slots
    cache = case.kv_cache.view(2, -1, num_kv_heads, head_size)
    torch.testing.assert_close(cache[0, case.layout.slot_mapping.to(device)], case.key, rtol=0, atol=0)
    torch.testing.assert_close(cache[1, case.layout.slot_mapping.to(device)], case.value, rtol=0, atol=0)
    return err


def test_prefill(device):
    check([(0, 37), (0, 5), (0, 1)], device=device)


def test_chunked_prefill_over_cached_prefix(device):
    check([(48, 20), (17, 33), (3, 64)], device=device)


def test_mixed_decode_and_prefill(device):
    check([(100, 1), (5, 1), (0, 1), (64, 40), (16, 16)], device=device)


@pytest.mark.parametrize("splits", [1, 4])
def test_decode(device, splits):
    check([(130, 1), (7, 1), (63, 1), (64, 1)], device=device, splits=splits)


@pytest.mark.parametrize("heads", [(4, 4), (8, 1), (6, 2), (12, 4)])
def test_gqa_mqa(device, heads):
    check([(20, 9), (33, 1)], num_heads=heads[0], num_kv_heads=heads[1], device=device)


@pytest.mark.parametrize("block_size", [1, 8, 32, 64])
def test_block_sizes(device, block_size):
    check([(70, 11), (3, 1), (129, 1)], block_size=block_size, device=device)


@pytest.mark.parametrize("head_size", [32, 80, 128])
def test_head_sizes(device, head_size):
    check([(21, 6), (40, 1)], head_size=head_size, device=device)


def test_dtypes(device):
    dtypes = [torch.float16, torch.float32] + ([torch.bfloat16] if device.type == "cuda" else [])
    for dtype in dtypes:
        check([(30, 10), (50, 1)], dtype=dtype, device=device)
        check([(30, 1), (50, 1)], dtype=dtype, device=device, splits=2)


def test_sliding_window_and_soft_cap(device):
    check([(90, 20), (40, 1), (0, 33)], sliding_window=16, device=device)
    check([(90, 1), (40, 1)], sliding_window=24, device=device, splits=2)
    check([(30, 12), (9, 1)], logits_soft_cap=5.0, device=device)


def test_padding_slots_are_not_written(device):
    from octavo.plugins.attention.triton import TritonAttentionBackend

    be = TritonAttentionBackend(num_heads=2, head_size=32, num_kv_heads=2, scale=0.1)
    cache = torch.randn(2, 4, 16, 2, 32, dtype=torch.float16, device=device)
    before = cache.clone()
    k = torch.randn(3, 2, 32, dtype=torch.float16, device=device)
    be.write_kv(k, k, cache, torch.tensor([-1, 17, -1], device=device))
    flat, flat0 = cache.view(2, -1, 2, 32), before.view(2, -1, 2, 32)
    assert torch.equal(flat[:, 17], torch.stack([k[1], k[1]]))
    flat[:, 17] = flat0[:, 17]
    assert torch.equal(cache, before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="long contexts: GPU only")
def test_long_context_8k(device):
    for dtype in (torch.bfloat16, torch.float16):
        check([(8191, 1), (4000, 1)], num_heads=32, num_kv_heads=8, head_size=128, dtype=dtype, device=device)
        check([(7680, 512)], num_heads=32, num_kv_heads=8, head_size=128, dtype=dtype, device=device)
        check([(8191, 1)], num_heads=32, num_kv_heads=8, head_size=128, dtype=dtype, device=device, splits=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU only")
def test_random_batches(device):
    g = torch.Generator().manual_seed(1)
    for seed in range(6):
        n = int(torch.randint(1, 12, (1,), generator=g))
        seqs = [(int(torch.randint(0, 600, (1,), generator=g)), int(torch.randint(1, 3, (1,), generator=g))
                 if i < n // 2 else int(torch.randint(1, 300, (1,), generator=g))) for i in range(n)]
        check(seqs, num_heads=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16, device=device, seed=seed,
              block_size=[16, 32, 64][seed % 3])
    assert math.isfinite(1.0)
