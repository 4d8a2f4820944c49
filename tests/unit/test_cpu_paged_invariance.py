"""A token's ``cpu_paged`` attention output is the same bits however its prompt reached the cache.

Why: with prefix caching, the same greedy request sent twice computes its last prompt tokens once as part of a
fresh prompt and once on top of a cached prefix; with int8 activations a rounding difference there flipped a
near-tie token (docs/quantization.md). Here one prompt (plus a second request sharing the steps) goes through
the backend's real ``build_metadata`` + ``forward`` as: one fresh prefill; a cached prefix then the rest;
chunks of uneven sizes; one token per decode step; and inside a batch with other requests. Every row must be
**bit for bit** the fresh prefill's row, for float32 and bfloat16, for several head shapes, block sizes and
thread counts; and the fresh rows are checked against float64 attention, so "equal" is also "right".
"""

from __future__ import annotations

import pytest
import torch

from octavo.attention import AttentionLayout
from octavo.plugins.attention import _cpu_paged_kernel as kernel
from octavo.plugins.attention.cpu_paged import CpuPagedAttentionBackend

pytestmark = pytest.mark.skipif(kernel.library() is None, reason=f"no C kernel: {kernel.unavailable_reason()}")

NUM_BLOCKS = 64


class _Run:
    """One request's K/V cache on its own shuffled blocks, filled step by step through the backend."""

    def __init__(self, backend, dtype, bs, kvh, d, table):
        self.backend, self.bs = backend, bs
        self.cache = torch.zeros(2, NUM_BLOCKS, bs, kvh, d, dtype=dtype)
        self.table = table

    def step(self, reqs):
        """``reqs``: list of (q, k, v, num_computed) per request (decode-only requests first) -> output rows."""
        q_lens = [r[0].shape[0] for r in reqs]
        qsl = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
        computed = torch.tensor([r[3] for r in reqs], dtype=torch.int32)
        seq_lens = computed + torch.tensor(q_lens, dtype=torch.int32)
        tables = torch.stack([t for t in self.table[:len(reqs)]]).to(torch.int32)
        slots = torch.cat([tables[i][torch.arange(int(computed[i]), int(seq_lens[i])) // self.bs].long() * self.bs
                           + torch.arange(int(computed[i]), int(seq_lens[i])) % self.bs for i in range(len(reqs))])
        num_decode = 0
        while num_decode < len(reqs) and q_lens[num_decode] == 1:
            num_decode += 1
        layout = AttentionLayout(qsl, seq_lens, computed, tables, slots, self.bs, max(q_lens), int(seq_lens.max()),
                                 num_decode)
        md = CpuPagedAttentionBackend.build_metadata(layout, torch.device("cpu"))
        cat = [torch.cat([r[j] for r in reqs]) for j in range(3)]
        return self.backend.forward(cat[0], cat[1], cat[2], self.cache, md)


def _reference(q, k, v, scale):
    """float64 causal attention of a whole prompt, KV heads repeated for their query groups."""
    g = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    scores = torch.einsum("qhd,khd->hqk", qd, kd) * scale
    scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vd)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kvh,d,bs", [(9, 3, 64, 16), (4, 4, 32, 8), (8, 2, 128, 32)])
def test_fresh_cached_chunked_decode_batched_are_bitwise_equal(threads, dtype, heads, kvh, d, bs):
    g = torch.Generator().manual_seed(heads * d + bs)
    n = 83  # crosses blocks and 16-position tiles; not a multiple of either
    q, k, v = (torch.randn(n, h, d, generator=g).to(dtype) for h in (heads, kvh, kvh))
    other = [torch.randn(37, h, d, generator=g).to(dtype) for h in (heads, kvh, kvh)]
    backend = CpuPagedAttentionBackend(num_heads=heads, head_size=d, num_kv_heads=kvh, scale=d ** -0.5)
    perm = torch.randperm(NUM_BLOCKS - 1, generator=g) + 1
    nb = -(-n // bs)
    tables = [perm[:nb], perm[nb:2 * nb]]  # request 0, and a second request of a batch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fresh = _Run(backend, dtype, bs, kvh, d, tables).step([(q, k, v, 0)])
        assert fresh.dtype == dtype and fresh.shape == q.shape
        tol = 2e-6 if dtype == torch.float32 else 1e-2  # bf16: the output is rounded to bf16
        assert (fresh.double() - _reference(q, k, v, d ** -0.5)).abs().max().item() < tol

        def chunks(cuts):
            run = _Run(backend, dtype, bs, kvh, d, tables)
            return torch.cat([run.step([(q[a:b], k[a:b], v[a:b], a)]) for a, b in zip(cuts, cuts[1:])])

        cases = {"cached prefix 48": chunks([0, 48, n]), "cached prefix 61": chunks([0, 61, n]),
                 "chunks 5/16/17/1/44": chunks([0, 5, 21, 38, 39, n]), "decode steps": chunks(list(range(n + 1)))}
        # batched: request 0's tail rides with a fresh prompt of another request (decode row first), then alone
        run = _Run(backend, dtype, bs, kvh, d, tables)
        head = run.step([(q[:50], k[:50], v[:50], 0)])
        mid = run.step([(q[50:51], k[50:51], v[50:51], 50), (*other, 0)])[:1]
        tail = run.step([(q[51:], k[51:], v[51:], 51)])
        cases["batched"] = torch.cat([head, mid, tail])
    finally:
        torch.set_num_threads(before)
    for name, out in cases.items():
        assert torch.equal(out, fresh), (name, (out.float() - fresh.float()).abs().max().item())
