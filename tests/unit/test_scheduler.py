"""Scheduler: token budget, chunk sizes, preemption order, priority — no model involved."""

from octavo.config import OctavoSettings
from octavo.core.kv_cache.manager import KVCacheManager
from octavo.core.messages import EngineCoreRequest
from octavo.core.request import Request, RequestStatus
from octavo.core.scheduler import Scheduler
from octavo.sampling_params import SamplingParams


def make(num_blocks=64, block_size=4, max_model_len=256, **kw):
    settings = OctavoSettings.from_kwargs(block_size=block_size, **kw)
    kv = KVCacheManager(num_blocks, block_size, settings.cache.enable_prefix_caching)
    return Scheduler(settings, kv, max_model_len)


def req(rid, n, arrival=0.0, priority=0, max_tokens=8):
    return Request(EngineCoreRequest(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens), arrival,
                                     priority, eos_token_id=None), max_tokens)


def run_step(s, token=7):
    out = s.schedule()
    sampled = {x.req.request_id: token for x in out.scheduled if x.samples}
    s.update(out, sampled)
    return out


def test_budget_and_chunked_prefill():
    s = make(max_num_batched_tokens=10, enable_prefix_caching=False)
    s.add_request(req("a", 25))
    s.add_request(req("b", 3, arrival=1))
    out = s.schedule()
    assert [(x.req.request_id, x.num_tokens) for x in out.scheduled] == [("a", 10)]
    s.update(out, {})
    out = s.schedule()
    assert [(x.req.request_id, x.num_tokens) for x in out.scheduled] == [("a", 10)]
    s.update(out, {})
    out = s.schedule()  # a's last 5 tokens, then b's 3 within the remaining budget
    assert [(x.req.request_id, x.num_tokens) for x in out.scheduled] == [("a", 5), ("b", 3)]
    assert out.total_num_tokens == 8 and all(x.samples for x in out.scheduled)


def test_decodes_are_ordered_first():
    s = make(max_num_batched_tokens=64, enable_prefix_caching=False)
    s.add_request(req("a", 5))
    run_step(s)
    s.add_request(req("b", 6, arrival=1))
    out = s.schedule()
    assert [x.req.request_id for x in out.scheduled] == ["a", "b"] and out.num_decode_reqs == 1


def test_max_num_seqs():
    s = make(max_num_seqs=2, enable_prefix_caching=False)
    for i in range(3):
        s.add_request(req(str(i), 4, arrival=i))
    assert len(s.schedule().scheduled) == 2


def test_preemption_takes_the_latest_request_and_it_resumes_unchanged():
    # 5 usable blocks of 4 tokens; two requests of 8 prompt tokens each grow until the cache is full.
    s = make(num_blocks=6, block_size=4, max_num_batched_tokens=64, enable_prefix_caching=False,
             kv_admission="greedy")  # projected admission would hold b back (tests/unit/test_kv_admission.py)
    s.add_request(req("a", 8, arrival=0, max_tokens=8))
    s.add_request(req("b", 8, arrival=1, max_tokens=8))
    tokens = {"a": [], "b": []}
    preempted = []
    for _ in range(40):
        out = s.schedule()
        preempted += out.preempted_ids
        sampled = {x.req.request_id: 100 + x.req.num_output_tokens for x in out.scheduled if x.samples}
        for rid, t in sampled.items():
            tokens[rid].append(t)
        s.update(out, sampled)
        if not s.has_unfinished_requests():
            break
    assert preempted and preempted[0] == "b"  # the later arrival is the victim
    assert s.stats.num_preemptions >= 1
    # the victim recomputed from prompt + output and continued where it stopped
    assert tokens["b"] == [100 + i for i in range(8)]
    assert tokens["a"] == [100 + i for i in range(8)]
    assert s.kv.pool.num_free_blocks == 5


def test_priority_policy_orders_waiting_and_preempts_lowest_priority():
    s = make(scheduling_policy="priority", max_num_seqs=1, enable_prefix_caching=False)
    s.add_request(req("low", 4, arrival=0, priority=5))
    s.add_request(req("high", 4, arrival=1, priority=0))
    out = s.schedule()
    assert [x.req.request_id for x in out.scheduled] == ["high"]


def test_request_that_can_never_fit_is_rejected_at_admission():
    s = make(num_blocks=3, block_size=4)
    try:
        s.add_request(req("big", 20))
    except ValueError as e:
        assert "KV cache" in str(e)
    else:
        raise AssertionError("expected ValueError")


def test_abort_frees_blocks():
    s = make(enable_prefix_caching=False)
    s.add_request(req("a", 10))
    run_step(s)
    free_before = s.kv.pool.num_free_blocks
    s.abort(["a"])
    assert s.kv.pool.num_free_blocks > free_before and not s.has_unfinished_requests()


def test_prefix_cache_hit_stats():
    s = make(max_num_batched_tokens=64)
    s.add_request(req("a", 17))
    run_step(s)
    s.add_request(req("b", 17, arrival=1))
    out = s.schedule()
    b = next(x for x in out.scheduled if x.req.request_id == "b")
    assert b.num_computed_tokens == 16 and b.num_tokens == 1
    assert s.stats.prefix_cache_hits == 16


def test_stop_conditions():
    s = make(enable_prefix_caching=False)
    r = Request(EngineCoreRequest("a", [1, 2], SamplingParams(max_tokens=10, min_tokens=2), 0.0, 0, eos_token_id=9), 10)
    s.add_request(r)
    run_step(s, token=9)  # EOS before min_tokens: the sampler masks it; if it came anyway it doesn't stop
    assert r.status == RequestStatus.RUNNING
    run_step(s, token=9)
    assert r.status == RequestStatus.FINISHED and str(r.finish_reason) == "stop"


def test_a_request_that_outgrows_the_whole_cache_finishes_instead_of_looping():
    s = make(num_blocks=4, block_size=4, max_num_batched_tokens=64, enable_prefix_caching=False)
    r = req("a", 6, max_tokens=50)  # 3 usable blocks = 12 tokens; it needs more while generating
    s.add_request(r)
    for _ in range(30):
        run_step(s)
        if not s.has_unfinished_requests():
            break
    assert r.status == RequestStatus.FINISHED and str(r.finish_reason) == "length"
    assert s.finished_out_of_cache == [r] and s.kv.pool.num_free_blocks == 3
