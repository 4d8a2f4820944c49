"""AsyncScheduler: placeholders, the step N+1 scheduled before N's tokens, finishes and preemption while a step
is in flight, and the batch's placeholder token ids — no model involved (the model-level parity is in
tests/e2e/test_async_scheduling.py)."""

from octavo.config import OctavoSettings
from octavo.core.async_scheduler import AsyncScheduler
from octavo.core.kv_cache.manager import KVCacheManager
from octavo.core.messages import EngineCoreRequest
from octavo.core.request import Request, RequestStatus
from octavo.core.step_builder import PLACEHOLDER, StepBuilder
from octavo.sampling_params import SamplingParams


def make(num_blocks=64, block_size=4, max_model_len=256, **kw):
    settings = OctavoSettings.from_kwargs(block_size=block_size, enable_prefix_caching=False, **kw)
    return AsyncScheduler(settings, KVCacheManager(num_blocks, block_size, False), max_model_len)


def req(rid, n, max_tokens=8, eos=None):
    return Request(EngineCoreRequest(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens), 0.0, 0,
                                     eos_token_id=eos), max_tokens)


def schedule(s):
    out = s.schedule()
    s.mark_scheduled(out)
    return out


def sampled(out, token=7):
    return {x.req.request_id: token for x in out.scheduled if x.samples}


def test_next_step_scheduled_on_placeholders():
    s, b = make(), StepBuilder()
    a = req("a", 5)
    s.add_request(a)
    n0 = schedule(s)  # prefill: samples, one placeholder
    assert [(x.num_tokens, x.samples) for x in n0.scheduled] == [(5, True)]
    assert a.num_computed_tokens == 5 and a.num_output_placeholders == 1
    b.build(n0)
    n1 = schedule(s)  # decode of the placeholder before n0's token is known
    assert [(x.num_tokens, x.num_computed_tokens, x.samples) for x in n1.scheduled] == [(1, 5, True)]
    assert b.build(n1).scheduled[0].token_ids == [PLACEHOLDER]
    assert a.num_output_placeholders == 2
    assert s.update(n0, sampled(n0, 11)) == [(a, [11])]
    assert a.output_token_ids == [11] and a.num_output_placeholders == 1
    n2 = schedule(s)  # computes n1's placeholder (n0's token is known now)
    assert b.build(n2).scheduled[0].token_ids == [PLACEHOLDER] and n2.scheduled[0].num_computed_tokens == 6
    s.update(n1, sampled(n1, 12))
    s.update(n2, sampled(n2, 13))
    assert a.output_token_ids == [11, 12, 13] and a.num_output_placeholders == 0 and a.num_computed_tokens == 7


def test_finished_at_n_drops_its_token_from_n_plus_1():
    s = make()
    a = req("a", 3, eos=2)
    s.add_request(a)
    n0 = schedule(s)
    n1 = schedule(s)
    s.update(n0, {"a": 2})  # EOS
    assert a.is_finished and a.output_token_ids == [2]
    assert s.update(n1, {"a": 9}) == [] and a.output_token_ids == [2]  # never emitted
    assert not s.has_unfinished_requests()


def test_request_sure_to_finish_is_not_scheduled_again():
    s = make()
    a = req("a", 3, max_tokens=1)
    s.add_request(a)
    n0 = schedule(s)
    assert schedule(s).is_empty  # its only token is in flight: nothing left to run
    s.update(n0, sampled(n0))
    assert a.is_finished and a.num_output_tokens == 1


def test_preempted_in_flight_waits_for_its_token():
    s = make(num_blocks=5, block_size=4, max_num_seqs=8, kv_admission="greedy")  # 4 usable blocks: 16 slots
    a, c = req("a", 7, max_tokens=20), req("c", 7, max_tokens=20)
    s.add_request(a)
    s.add_request(c)
    n0 = schedule(s)  # both prefill: 2 blocks each
    assert len(n0.scheduled) == 2
    n1 = schedule(s)  # both decode position 7 (still in their second block)
    s.update(n0, sampled(n0, 5))
    n2 = schedule(s)  # position 8 needs a third block each: c is preempted while n1 runs it
    assert [x.req.request_id for x in n2.scheduled] == ["a"]
    assert c.status == RequestStatus.PREEMPTED and c.num_computed_tokens == 0 and c.num_output_placeholders == 1
    s.update(n1, sampled(n1, 6))  # c's token from n1 is kept (a real token, as in the synchronous engine)
    assert c.output_token_ids == [5, 6] and c.num_output_placeholders == 0
    s.update(n2, sampled(n2, 8))
    assert a.output_token_ids == [5, 6, 8]
