"""The CUDA graph runner: a replayed, padded decode batch gives what the eager forward gives, and writes
the same K/V (padding rows touch only the null block)."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from octavo.model import ForwardContext

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("CUDA graphs need a CUDA GPU", allow_module_level=True)


class ToyModel(nn.Module):
    """Embedding -> 2 x (qkv projection, paged attention, output projection with a residual)."""

    def __init__(self, vocab=100, hidden=256, heads=8, kv_heads=2, head=32, layers=2):
        super().__init__()
        from octavo.nn.attention import Attention

        self.emb = nn.Embedding(vocab, hidden)
        self.qkv = nn.ModuleList(nn.Linear(hidden, (heads + 2 * kv_heads) * head) for _ in range(layers))
        self.o = nn.ModuleList(nn.Linear(heads * head, hidden) for _ in range(layers))
        self.attn = nn.ModuleList(Attention(heads, head, head**-0.5, kv_heads) for _ in range(layers))
        self.split = [heads * head, kv_heads * head, kv_heads * head]

    def forward(self, input_ids, positions, ctx):
        x = self.emb(input_ids) + positions[:, None].to(self.emb.weight.dtype) * 1e-3
        for qkv, o, attn in zip(self.qkv, self.o, self.attn):
            q, k, v = qkv(x).split(self.split, -1)
            x = x + o(attn(q, k, v, ctx))
        return x


def _inputs(n, block_size, num_blocks, max_blocks, g):
    from octavo.attention import AttentionLayout

    seq_lens = torch.randint(1, max_blocks * block_size, (n,), generator=g)
    perm = torch.randperm(num_blocks - 1, generator=g) + 1  # never the null block
    tables = perm[: n * max_blocks].view(n, max_blocks).to(torch.int32)
    pos = seq_lens - 1
    slots = tables[torch.arange(n), pos // block_size].long() * block_size + pos % block_size
    layout = AttentionLayout(torch.arange(n + 1, dtype=torch.int32), seq_lens.int(), pos.int(), tables, slots,
                             block_size, 1, int(seq_lens.max()), n)
    ids = torch.randint(0, 100, (n,), generator=g)
    return SimpleNamespace(input_ids=ids.cuda(), positions=pos.cuda(), layout=layout)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_graph_replay_matches_eager(dtype):
    from octavo.plugins.attention.triton import TritonAttentionBackend as B
    from octavo.plugins.platforms.cuda_graphs import CUDAGraphRunner

    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = ToyModel().to(dev, dtype)
    block_size, max_blocks, num_blocks = 16, 8, 8 * 16 + 1
    caches = []
    for layer in model.attn:
        kv = torch.randn(B.kv_cache_shape(num_blocks, block_size, 2, 32), dtype=dtype, device=dev)
        layer.bind(B(num_heads=8, head_size=32, num_kv_heads=2, scale=32**-0.5), kv)
        caches.append(kv)
    runner = CUDAGraphRunner(model, B, dev, block_size, max_blocks * block_size, [1, 2, 4, 8, 16])
    runner.capture()
    g = torch.Generator().manual_seed(0)
    for n in (1, 3, 8, 13, 16, 2):
        inp = _inputs(n, block_size, num_blocks, max_blocks, g)
        before = [c.clone() for c in caches]
        with torch.inference_mode():
            out = runner.maybe_run(inp).clone()
            after_graph = [c.clone() for c in caches]
            for c, b in zip(caches, before):
                c.copy_(b)
            md = B.build_metadata(inp.layout, dev)
            ref = model(inp.input_ids, inp.positions, ForwardContext(md))
        torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
        for a, c in zip(after_graph, caches):
            # same K/V written; padding rows wrote only into the null block 0
            assert torch.equal(a[:, 1:], c[:, 1:])
    assert runner.num_replays == 6
    # prefill batches are not for graphs
    inp.layout.max_query_len = 2
    assert runner.maybe_run(inp) is None
