"""Block pool and KV-cache manager: allocation, ref counts, LRU eviction order, prefix hits, collisions."""

import pytest

from octavo.core.kv_cache import block_pool as bp
from octavo.core.kv_cache.block_pool import BlockPool, hash_block_tokens
from octavo.core.kv_cache.manager import KVCacheManager
from octavo.core.messages import EngineCoreRequest
from octavo.core.request import Request
from octavo.sampling_params import SamplingParams


def make_req(rid, tokens, **sp):
    return Request(EngineCoreRequest(rid, list(tokens), SamplingParams(**sp), 0.0), max_tokens=16)


def test_null_block_is_never_allocated():
    pool = BlockPool(4, enable_caching=True)
    blocks = pool.allocate(3)
    assert 0 not in [b.block_id for b in blocks]
    assert pool.num_free_blocks == 0
    with pytest.raises(RuntimeError):
        pool.allocate(1)


def test_ref_counts_and_free():
    pool = BlockPool(5, enable_caching=True)
    a = pool.allocate(2)
    pool.touch(a)  # a second holder
    pool.free(a)
    assert pool.num_free_blocks == 2  # still held once
    pool.free(a)
    assert pool.num_free_blocks == 4
    with pytest.raises(AssertionError):
        pool.free(a)


def test_eviction_order_is_least_recently_freed_first():
    pool = BlockPool(6, enable_caching=True)
    a, b, c = pool.allocate(1), pool.allocate(1), pool.allocate(1)
    for i, blk in enumerate((a, b, c)):
        pool.cache_full_block(blk[0], hash_block_tokens(None, [i]), (i,))
    pool.free(b)
    pool.free(a)
    pool.free(c)
    # never-used blocks (4, 5) come first, then b, a, c in the order they were freed
    order = [pool.allocate(1)[0].block_id for _ in range(5)]
    assert order == [4, 5, b[0].block_id, a[0].block_id, c[0].block_id]
    assert pool.cached == {}  # reallocated blocks left the prefix cache


def test_prefix_hit_shares_blocks_and_leaves_one_token_to_compute():
    kv = KVCacheManager(num_blocks=10, block_size=4, enable_caching=True)
    r1 = make_req("a", range(12))
    assert kv.allocate_slots(r1, 12)
    r2 = make_req("b", range(12))
    hits, n = kv.get_computed_blocks(r2)
    # 12 tokens = 3 full blocks, but the last token must be computed: at most 2 blocks hit
    assert n == 8 and [b.block_id for b in hits] == kv.block_ids("a")[:2]
    r2.num_computed_tokens = 0
    assert kv.allocate_slots(r2, 4, hits)
    assert kv.block_ids("b")[:2] == kv.block_ids("a")[:2]
    assert all(b.ref_cnt == 2 for b in hits)
    kv.free(r1)
    kv.free(r2)
    assert kv.pool.num_free_blocks == 9


def test_freed_cached_blocks_are_reused_until_evicted():
    kv = KVCacheManager(num_blocks=4, block_size=2, enable_caching=True)
    r1 = make_req("a", [1, 2, 3, 4, 5])
    assert kv.allocate_slots(r1, 5)
    kv.free(r1)
    hits, n = kv.get_computed_blocks(make_req("b", [1, 2, 3, 4, 9]))
    assert n == 4
    # a different request needing all 3 blocks evicts them
    r3 = make_req("c", [7, 7, 7, 7, 7, 7])
    assert kv.allocate_slots(r3, 6)
    assert kv.get_computed_blocks(make_req("d", [1, 2, 3, 4, 9]))[1] == 0


def test_hash_collision_is_a_miss(monkeypatch):
    monkeypatch.setattr("octavo.core.kv_cache.manager.hash_block_tokens", lambda parent, toks, extra=None: b"same")
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_caching=True)
    r1 = make_req("a", [1, 2, 3])
    assert kv.allocate_slots(r1, 3)
    hits, n = kv.get_computed_blocks(make_req("b", [5, 6, 7]))
    assert n == 0 and hits == []  # same hash, different tokens: never served
    assert bp.hash_block_tokens(None, [1, 2]) != bp.hash_block_tokens(None, [2, 1])


def test_extra_keys_and_chain_change_the_hash():
    h1 = hash_block_tokens(None, [1, 2], None)
    assert hash_block_tokens(None, [1, 2], "salt") != h1
    assert hash_block_tokens(h1, [1, 2], None) != h1


def test_prompt_logprobs_requests_skip_the_prefix_cache():
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_caching=True)
    assert kv.allocate_slots(make_req("a", [1, 2, 3, 4, 5]), 5)
    assert kv.get_computed_blocks(make_req("b", [1, 2, 3, 4, 5], prompt_logprobs=1))[1] == 0


def test_allocation_failure_changes_nothing():
    kv = KVCacheManager(num_blocks=3, block_size=2, enable_caching=False)
    r = make_req("a", range(6))
    assert not kv.allocate_slots(r, 6)
    assert kv.pool.num_free_blocks == 2 and kv.block_ids("a") == []
