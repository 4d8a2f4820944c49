"""Scheduler side of speculative decoding, no model: lookahead slots inside the one token budget, drafts cut
so max_tokens / max_model_len are never overshot, rollback of rejected slots, stops inside verified tokens."""

from octavo.config import OctavoSettings
from octavo.core.kv_cache.manager import KVCacheManager
from octavo.core.messages import EngineCoreRequest, FinishReason
from octavo.core.request import Request
from octavo.core.scheduler import Scheduler
from octavo.sampling_params import SamplingParams


def make(num_blocks=64, block_size=4, max_model_len=256, **kw):
    settings = OctavoSettings.from_kwargs(block_size=block_size, **kw)
    kv = KVCacheManager(num_blocks, block_size, settings.cache.enable_prefix_caching)
    return Scheduler(settings, kv, max_model_len)


def req(rid, n, max_tokens=8, **params):
    return Request(EngineCoreRequest(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens, **params),
                                     0.0, 0, eos_token_id=0), max_tokens)


def prefill(s, r):
    s.add_request(r)
    out = s.schedule()
    s.update(out, {r.request_id: 50})
    assert r.num_computed_tokens == r.num_tokens - 1


def test_drafts_take_lookahead_slots_within_the_budget():
    s = make(max_num_batched_tokens=6, enable_prefix_caching=False)
    a, b = req("a", 3), req("b", 3)
    s.add_request(a)
    s.add_request(b)
    s.update(s.schedule(), {"a": 50, "b": 50})
    s.spec_drafts = {"a": [1, 2, 3, 4], "b": [9, 9, 9]}
    out = s.schedule()
    got = [(x.req.request_id, x.num_tokens, x.spec_token_ids, x.samples) for x in out.scheduled]
    # a: 1 + 4 drafts = 5 of the 6-token budget; b gets the last token, no room for drafts
    assert got == [("b", 1, [], True), ("a", 5, [1, 2, 3, 4], True)]
    assert out.total_num_tokens == 6
    assert not s.spec_drafts  # drafts are used once


def test_rollback_of_rejected_drafts_and_tail_blocks():
    s = make(max_num_batched_tokens=64, enable_prefix_caching=False, block_size=4)
    a = req("a", 7, max_tokens=20)  # 7 prompt tokens
    prefill(s, a)  # a now holds 8 tokens, 7 computed (2 blocks)
    s.spec_drafts = {"a": [1, 2, 3, 4, 5, 6]}
    out = s.schedule()
    assert out.scheduled[0].num_tokens == 7 and len(s.kv.block_ids("a")) == 4  # 7 + 7 = 14 slots
    free_before = s.kv.pool.num_free_blocks
    s.update(out, {"a": [1, 2, 77]})  # two drafts accepted, then a correction
    assert a.output_token_ids == [50, 1, 2, 77]
    assert a.num_computed_tokens == 10 and a.num_tokens == 11  # last token + 2 accepted in the cache
    assert len(s.kv.block_ids("a")) == 3 and s.kv.pool.num_free_blocks == free_before + 1
    st = s.make_stats()
    assert (st.spec_decode_num_drafts, st.spec_decode_num_draft_tokens, st.spec_decode_num_accepted_tokens,
            st.spec_decode_num_emitted_tokens, st.spec_decode_accepted_per_pos) == (1, 6, 2, 3, [1, 1, 0, 0, 0, 0])


def test_max_tokens_and_max_model_len_are_never_overshot():
    s = make(max_num_batched_tokens=64, enable_prefix_caching=False, max_model_len=12)
    a = req("a", 5, max_tokens=4)
    prefill(s, a)  # 1 output token; 3 more allowed -> at most 2 drafts
    s.spec_drafts = {"a": [1, 2, 3, 4]}
    out = s.schedule()
    assert out.scheduled[0].spec_token_ids == [1, 2]
    s.update(out, {"a": [1, 2, 3]})
    assert a.num_output_tokens == 4 and a.finish_reason == FinishReason.LENGTH
    b = req("b", 8, max_tokens=100)  # max_model_len 12: 9 tokens after prefill -> at most 2 drafts
    prefill(s, b)
    s.spec_drafts = {"b": [1, 2, 3, 4]}
    out = s.schedule()
    assert out.scheduled[0].spec_token_ids == [1, 2]


def test_a_stop_inside_the_verified_tokens_drops_the_rest():
    s = make(max_num_batched_tokens=64, enable_prefix_caching=False)
    a = req("a", 5, max_tokens=20, stop_token_ids=[3])
    prefill(s, a)
    s.spec_drafts = {"a": [1, 3, 4]}
    out = s.schedule()
    s.update(out, {"a": [1, 3, 4, 8]})
    assert a.output_token_ids == [50, 1, 3] and a.finish_reason == FinishReason.STOP
    st = s.make_stats()
    assert st.spec_decode_num_accepted_tokens == 3 and st.spec_decode_num_emitted_tokens == 2


def test_no_drafts_while_prefilling_and_prefix_hashes_cover_verified_tokens_only():
    s = make(max_num_batched_tokens=64, block_size=4)
    a = req("a", 6, max_tokens=20)
    s.add_request(a)
    s.spec_drafts = {"a": [1, 2]}
    out = s.schedule()
    assert out.scheduled[0].spec_token_ids == [] and out.scheduled[0].num_tokens == 6
    s.update(out, {"a": 50})
    s.spec_drafts = {"a": [1, 2, 3, 4, 5]}
    out = s.schedule()
    # 7 verified tokens -> one full block hashed; the drafts' slots (positions 7..11) are not
    assert len(s.kv.req_hashes["a"]) == 1
    s.update(out, {"a": [9]})  # every draft rejected
    assert a.num_computed_tokens == 7 and len(s.kv.block_ids("a")) == 2
