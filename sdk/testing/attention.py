"""``AttentionBackendContract``: the pytest suite every attention backend must pass, built-in or third-party.

Subclass it and set ``backend_cls`` (and ``device``, ``dtypes``, ``block_sizes`` if the defaults do not
fit). Each check simulates several engine steps over a random paged layout — fresh prefills, prefill chunks
on top of cached prefixes, prefix-cache hits that share another request's blocks, and decodes, with the
physical blocks shuffled — and compares every output with a float64 dense-attention computation. Keys and
values of earlier steps reach later steps only through the backend's own cache, so a backend that writes
the cache wrongly fails whatever its cache layout. The cache starts filled with random values: reading an
unwritten slot is caught too.

    from octavo.testing import AttentionBackendContract

    class TestMyBackend(AttentionBackendContract):
        backend_cls = MyBackend
        device = "cuda"
        dtypes = (torch.bfloat16, torch.float16)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import torch

from octavo.attention import AttentionBackend, AttentionLayout
from octavo.platform import Availability

# absolute tolerance per dtype on outputs of unit-variance values (inputs are already rounded to the dtype)
TOLERANCES = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-10}


# ---------------------------------------------------------------------------------- layout helpers

@dataclass
class PagedRequest:
    """One request of a simulated batch: its block table and how many tokens are already cached."""

    block_ids: list[int]
    num_computed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def make_layout(block_tables: list[list[int]], num_computed: list[int], num_new: list[int],
                block_size: int) -> AttentionLayout:
    """An :class:`AttentionLayout` for requests given in flat-batch order (decodes should come first).

    Args:
        block_tables: physical block ids of each request (enough for ``num_computed + num_new`` tokens).
        num_computed: tokens of each request already in the cache.
        num_new: new tokens of each request this step.
        block_size: tokens per block.
    """
    seq_lens = [c + n for c, n in zip(num_computed, num_new)]
    for table, seq_len in zip(block_tables, seq_lens):
        if len(table) * block_size < seq_len:
            raise ValueError(f"block table of {len(table)} blocks cannot hold {seq_len} tokens")
    max_blocks = max(1, max(len(t) for t in block_tables))
    tables = torch.zeros(len(block_tables), max_blocks, dtype=torch.int32)
    slots = []
    for i, table in enumerate(block_tables):
        tables[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
        for pos in range(num_computed[i], seq_lens[i]):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    num_decodes = 0
    for n in num_new:
        if n != 1:
            break
        num_decodes += 1
    qsl = [0]
    for n in num_new:
        qsl.append(qsl[-1] + n)
    return AttentionLayout(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_computed_tokens=torch.tensor(num_computed, dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_size=block_size,
        max_query_len=max(num_new),
        max_seq_len=max(seq_lens),
        num_decode_reqs=num_decodes,
    )


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor, scale: float,
                    sliding_window: int | None = None, soft_cap: float | None = None) -> torch.Tensor:
    """float64 reference for one request: ``q [n, H, d]`` over context ``k, v [L, KVH, d]``.

    Query ``i`` sits at position ``q_positions[i]`` and sees context positions ``p <= q_positions[i]`` (and
    ``p > q_positions[i] - sliding_window``).
    """
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # [L, H, d]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # [H, n, L]
    if soft_cap:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    k_pos = torch.arange(k.shape[0])[None, :]
    allowed = k_pos <= q_positions[:, None]
    if sliding_window is not None:
        allowed &= k_pos > q_positions[:, None] - sliding_window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)  # [n, H, d]


def _plan(rng: random.Random, block_size: int, num_steps: int = 3):
    """Random requests: per request its context length, block table, and new tokens per step.

    Returns ``(requests, steps, num_blocks)`` where each request is ``{"len", "blocks", "chunks": [n per step],
    "share": (other request, full blocks shared) or None}``.
    """
    requests = []
    kinds = ["decode", "decode", "chunked", "prefill", "shared", "decode", "chunked"]
    for kind in kinds:
        if kind == "decode":  # prompt in step 0, then one token per step
            prompt = rng.randint(1, 3 * block_size + 3)
            chunks = [prompt] + [1] * (num_steps - 1)
        elif kind == "chunked":  # a long prompt split over all steps
            chunks = [rng.randint(1, 2 * block_size + 5) for _ in range(num_steps)]
        elif kind == "prefill":  # arrives in the last step, whole prompt at once
            chunks = [0] * (num_steps - 1) + [rng.randint(2, 2 * block_size + 7)]
        else:  # arrives in step 1 with a prefix-cache hit on request 0's full blocks
            chunks = [0, rng.randint(1, block_size + 3)] + [1] * (num_steps - 2)
        requests.append({"kind": kind, "chunks": chunks, "share": None})
    for r in requests:
        if r["kind"] == "shared":
            full = requests[0]["chunks"][0] // block_size
            if full == 0:  # nothing to share: a plain late prefill
                r["kind"] = "prefill"
            else:
                r["share"] = full
                r["prefix"] = full * block_size
        r["len"] = r.get("prefix", 0) + sum(r["chunks"])
        r["own"] = math.ceil(r["len"] / block_size) - (r["share"] or 0)
    # physical blocks in random order; block 0 is the null block and is never handed out
    order = list(range(1, sum(r["own"] for r in requests) + 1))
    rng.shuffle(order)
    next_block = 0
    for r in requests:
        shared = requests[0]["blocks"][: r["share"]] if r["share"] else []
        r["blocks"] = shared + order[next_block:next_block + r["own"]]
        next_block += r["own"]
    num_blocks = max(max(r["blocks"]) for r in requests) + 1
    return requests, num_blocks


class AttentionBackendContract:
    """Contract tests for an :class:`octavo.AttentionBackend` subclass.

    Attributes:
        backend_cls: the class under test (required).
        device: where tensors live (``"cpu"``, ``"cuda"``, ...).
        dtypes: compute/cache dtypes to check (unsupported ones are skipped via ``supports``).
        block_sizes: KV block sizes to check.
        head_configs: ``(num_heads, num_kv_heads, head_size)`` shapes to check (GQA included).
        tolerances: absolute tolerance per dtype against the float64 reference.
    """

    backend_cls: ClassVar[type[AttentionBackend]]
    device: ClassVar[str] = "cpu"
    dtypes: ClassVar[tuple] = (torch.float32, torch.bfloat16, torch.float16)
    block_sizes: ClassVar[tuple] = (16, 4)
    head_configs: ClassVar[tuple] = ((4, 4, 64), (8, 2, 64), (6, 1, 32), (4, 2, 128))
    tolerances: ClassVar[dict] = TOLERANCES

    # ----------------------------------------------------------------------------- helpers
    def _supported(self, dtype, head_size, block_size, sliding_window=None, soft_cap=None) -> Availability:
        return self.backend_cls.supports(device_type=torch.device(self.device).type, dtype=dtype,
                                         head_size=head_size, sliding_window=sliding_window,
                                         logits_soft_cap=soft_cap, block_size=block_size)

    def _run_scenario(self, *, seed, dtype, block_size, num_heads, num_kv_heads, head_size,
                      layer_options: list[dict]) -> None:
        """Simulate three steps over a random paged layout; each entry of ``layer_options`` is one layer."""
        rng = random.Random(seed)
        gen = torch.Generator().manual_seed(seed)
        device = torch.device(self.device)
        requests, num_blocks = _plan(rng, block_size)
        num_blocks += 2  # a spare block nobody uses
        scale = head_size**-0.5
        # full per-request q/k/v of every position, rounded to the dtype, kept on the host
        for r in requests:
            for name, heads in (("q", num_heads), ("k", num_kv_heads), ("v", num_kv_heads)):
                r[name] = torch.randn(r["len"], heads, head_size, generator=gen).to(dtype)
        donor = requests[0]
        for r in requests:
            if r["share"]:  # shared prefix: same tokens, so the same keys and values
                r["k"][: r["prefix"]] = donor["k"][: r["prefix"]]
                r["v"][: r["prefix"]] = donor["v"][: r["prefix"]]
        layers = []
        for opts in layer_options:
            impl = self.backend_cls(num_heads=num_heads, head_size=head_size, num_kv_heads=num_kv_heads,
                                    scale=scale, sliding_window=opts.get("sliding_window"),
                                    logits_soft_cap=opts.get("soft_cap"))
            shape = self.backend_cls.kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
            cache = torch.randn(shape, generator=gen).to(dtype).to(device)  # garbage: unwritten slots
            layers.append((opts, impl, cache))
        done = [r.get("prefix", 0) for r in requests]
        num_steps = len(requests[0]["chunks"])
        for step in range(num_steps):
            active = [i for i, r in enumerate(requests) if r["chunks"][step] > 0]
            active.sort(key=lambda i: requests[i]["chunks"][step] != 1)  # decodes first, as the scheduler does
            num_new = [requests[i]["chunks"][step] for i in active]
            num_computed = [done[i] for i in active]
            layout = make_layout([requests[i]["blocks"] for i in active], num_computed, num_new, block_size)
            metadata = self.backend_cls.build_metadata(layout, device)
            q = torch.cat([requests[i]["q"][c:c + n] for i, c, n in zip(active, num_computed, num_new)])
            k = torch.cat([requests[i]["k"][c:c + n] for i, c, n in zip(active, num_computed, num_new)])
            v = torch.cat([requests[i]["v"][c:c + n] for i, c, n in zip(active, num_computed, num_new)])
            for opts, impl, cache in layers:  # several layers share one step's metadata
                out = impl.forward(q.to(device), k.to(device), v.to(device), cache, metadata)
                assert out.shape == q.shape, f"output shape {tuple(out.shape)} != query shape {tuple(q.shape)}"
                assert out.dtype == q.dtype, f"output dtype {out.dtype} != query dtype {q.dtype}"
                out = out.cpu()
                tol = self.tolerances[dtype]
                start = 0
                for i, c, n in zip(active, num_computed, num_new):
                    r = requests[i]
                    ref = dense_attention(r["q"][c:c + n], r["k"][: c + n], r["v"][: c + n],
                                          torch.arange(c, c + n), scale, opts.get("sliding_window"),
                                          opts.get("soft_cap"))
                    err = (out[start:start + n].double() - ref).abs().max().item()
                    assert err <= tol, (
                        f"step {step}, request {i} ({r['kind']}, cached {c}, new {n}), {opts}, {dtype}, "
                        f"block_size {block_size}, heads {num_heads}/{num_kv_heads}x{head_size}: max error "
                        f"{err:.3g} > {tol:.3g} against float64 attention")
                    start += n
                if tuple(cache.shape) == (2, num_blocks, block_size, num_kv_heads, head_size):
                    slots = layout.slot_mapping.to(device)
                    flat = cache.view(2, -1, num_kv_heads, head_size)
                    assert torch.equal(flat[0][slots].cpu(), k), "keys in the cache differ from the ones written"
                    assert torch.equal(flat[1][slots].cpu(), v), "values in the cache differ from the ones written"
            for i, n in zip(active, num_new):
                done[i] += n

    # ------------------------------------------------------------------------------- checks
    def test_declares_name_and_availability(self):
        cls = self.backend_cls
        assert issubclass(cls, AttentionBackend), "backend_cls must subclass octavo.AttentionBackend"
        assert isinstance(getattr(cls, "name", None), str) and cls.name, "backend_cls.name must be a non-empty str"
        available = cls.is_available()
        assert isinstance(available, Availability)
        if not available:
            assert available.reason, "an unavailable backend must say why"
            pytest.skip(f"{cls.name} is not available here: {available.reason}")

    def _skip_if_unavailable(self):
        available = self.backend_cls.is_available()
        if not available:
            pytest.skip(f"{self.backend_cls.name} is not available here: {available.reason}")

    def test_supports_returns_availability(self):
        result = self._supported(self.dtypes[0], 64, self.block_sizes[0])
        assert isinstance(result, Availability)
        if not result:
            assert result.reason, "supports() must give a reason when it says no"

    def test_matches_float64_attention(self):
        """Mixed prefills, chunks on cached prefixes, prefix-cache hits and decodes, GQA, every dtype/block size."""
        self._skip_if_unavailable()
        ran = 0
        for dtype in self.dtypes:
            for block_size in self.block_sizes:
                for seed, (num_heads, num_kv_heads, head_size) in enumerate(self.head_configs):
                    if not self._supported(dtype, head_size, block_size):
                        continue
                    self._run_scenario(seed=seed, dtype=dtype, block_size=block_size, num_heads=num_heads,
                                       num_kv_heads=num_kv_heads, head_size=head_size, layer_options=[{}, {}])
                    ran += 1
        assert ran, "supports() refused every dtype/head size/block size this suite checks; adjust the attributes"

    def test_sliding_window(self):
        self._skip_if_unavailable()
        ran = 0
        for dtype in self.dtypes[:1] + self.dtypes[-1:]:
            for window in (1, 5, 17):
                if not self._supported(dtype, 64, self.block_sizes[0], sliding_window=window):
                    continue
                # a windowed layer and a full layer share one step's metadata
                self._run_scenario(seed=window, dtype=dtype, block_size=self.block_sizes[0], num_heads=4,
                                   num_kv_heads=2, head_size=64, layer_options=[{"sliding_window": window}, {}])
                ran += 1
        if not ran:
            pytest.skip(f"{self.backend_cls.name} does not support sliding windows")

    def test_logits_soft_cap(self):
        self._skip_if_unavailable()
        dtype = self.dtypes[0]
        if not self._supported(dtype, 64, self.block_sizes[0], soft_cap=30.0):
            pytest.skip(f"{self.backend_cls.name} does not support logits_soft_cap")
        # a cap small enough to bend the scores (inputs scaled up so tanh saturates)
        self._run_scenario(seed=7, dtype=dtype, block_size=self.block_sizes[0], num_heads=4, num_kv_heads=4,
                           head_size=64, layer_options=[{"soft_cap": 0.5}, {"soft_cap": 30.0}])

    def test_kv_cache_shape_holds_every_slot(self):
        shape = self.backend_cls.kv_cache_shape(10, 16, 2, 64)
        assert math.prod(shape) >= 2 * 10 * 16 * 2 * 64, f"kv_cache_shape {shape} cannot hold K and V of every slot"
