"""KV manager: full blocks are hashed for prefix caching incrementally (each decode step looks only at blocks it
has not handled yet, O(1) per request when no block fills), with the same hashes as hashing the whole sequence
at once, also after speculative tail blocks are released and the request grows again."""

from octavo.core.kv_cache.manager import KVCacheManager
from octavo.core.messages import EngineCoreRequest
from octavo.core.request import Request
from octavo.sampling_params import SamplingParams


def _req(rid, n):
    return Request(EngineCoreRequest(rid, list(range(1, n + 1)), SamplingParams(max_tokens=64), 0.0, 0), 64)


def _decode(kv, r, steps, token=7):
    for _ in range(steps):
        r.append_output_token(token)
        assert kv.allocate_slots(r, 1)
        r.num_computed_tokens += 1


def test_decode_blocks_hashed_as_whole_sequence():
    kv = KVCacheManager(64, 4, True)
    r = _req("a", 10)
    assert kv.allocate_slots(r, 10)
    r.num_computed_tokens = 10
    _decode(kv, r, 13)  # 23 tokens: 5 full blocks
    blocks = kv.req_blocks["a"]
    assert all(b.block_hash is not None for b in blocks[:5]) and blocks[5].block_hash is None
    ref = KVCacheManager(64, 4, True)
    twin = _req("b", 10)
    for t in r.output_token_ids:
        twin.append_output_token(t)
    assert [b.block_hash for b in blocks[:5]] == ref._block_hashes(twin, 5)
    # a second request with the same 23 tokens as its prompt hits all 5 blocks
    hits, n = kv.get_computed_blocks(twin)
    assert n == 20 and [b.block_id for b in hits] == [b.block_id for b in blocks[:5]]


def test_tail_release_then_growth_keeps_hashing():
    kv = KVCacheManager(64, 4, True)
    r = _req("a", 8)
    assert kv.allocate_slots(r, 8 + 6)  # 8 known tokens + 6 draft slots (never hashed: not known tokens)
    r.num_computed_tokens = 8
    assert [b.block_hash is not None for b in kv.req_blocks["a"]] == [True, True, False, False]
    kv.free_tail_blocks(r, 8)  # drafts rejected: back to 2 blocks
    assert len(kv.req_blocks["a"]) == 2
    _decode(kv, r, 8)  # 16 tokens: 4 full blocks, the last two hashed as they fill
    assert all(b.block_hash is not None for b in kv.req_blocks["a"])
    kv.free(r)
    assert "a" not in kv.req_num_cached
