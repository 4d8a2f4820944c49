"""Projected KV admission (core/kv_admission.py) through the real Scheduler and KV manager, no model: a request
waits while the running set's projected peak leaves it no room, starts once room frees, never starves behind
later arrivals, never deadlocks (a request that needs the whole cache runs alone), and adapts its estimate for
requests that may stop early (kv_admission_ratio / kv_admission_ratio_after_preemption)."""

import pytest

from octavo.config import ConfigError, OctavoSettings
from octavo.core.kv_admission import KVAdmission, output_length_known
from octavo.core.kv_cache.manager import KVCacheManager
from octavo.core.messages import EngineCoreRequest
from octavo.core.request import Request, RequestStatus
from octavo.core.scheduler import Scheduler
from octavo.sampling_params import SamplingParams

EOS = 2


def make(num_blocks=17, block_size=4, max_model_len=256, **kw):
    kw.setdefault("enable_prefix_caching", False)
    kw.setdefault("max_num_batched_tokens", 64)
    settings = OctavoSettings.from_kwargs(block_size=block_size, **kw)
    kv = KVCacheManager(num_blocks, block_size, settings.cache.enable_prefix_caching)
    return Scheduler(settings, kv, max_model_len)


def req(rid, n, max_tokens=8, arrival=0.0, eos=False, first=1):
    """``eos``: the request may stop at EOS (its length is unknown); else it runs to max_tokens."""
    p = SamplingParams(max_tokens=max_tokens, ignore_eos=not eos)
    return Request(EngineCoreRequest(rid, list(range(first, first + n)), p, arrival, 0, eos_token_id=EOS), max_tokens)


def step(s, stop=()):
    """One schedule + update; requests named in ``stop`` sample EOS, the others token 7."""
    out = s.schedule()
    s.update(out, {x.req.request_id: EOS if x.req.request_id in stop else 7 for x in out.scheduled if x.samples})
    return out


def running(s):
    return [r.request_id for r in s.running]


def test_known_lengths_wait_for_headroom_then_start_without_preemption():
    # 16 usable blocks of 4 = 64 tokens; each request ends at 8 + 16 = 24 tokens (6 blocks): two fit, not three
    s = make()
    for i in range(3):
        s.add_request(req(f"r{i}", 8, max_tokens=16, arrival=i, first=100 * i))
    step(s)
    assert running(s) == ["r0", "r1"]  # r2's prompt fits now (2 blocks free...) but not the peak
    assert s.kv.pool.num_free_blocks >= 2 and s.waiting[0].request_id == "r2"
    for _ in range(15):
        step(s)
    assert running(s) == ["r2"]  # r0 and r1 finished (16 tokens each): r2 started
    while s.has_unfinished_requests():
        step(s)
    assert s.stats.num_preemptions == 0 and s.kv.pool.num_free_blocks == 16


def test_greedy_admits_the_same_workload_and_preempts():
    s = make(kv_admission="greedy")
    for i in range(3):
        s.add_request(req(f"r{i}", 8, max_tokens=16, arrival=i, first=100 * i))
    step(s)
    assert running(s) == ["r0", "r1", "r2"]
    while s.has_unfinished_requests():
        step(s)
    assert s.stats.num_preemptions > 0


def test_admission_counts_requests_finishing_before_the_peak():
    # r0 is 2 tokens from its end; r1 (24 tokens at its end) fits alongside r0's whole growth only because r0
    # frees its 6 blocks long before r1 peaks: the sum of growth says no, the projection over time says yes.
    s = make(num_blocks=13)  # 12 usable blocks = 48 tokens
    s.add_request(req("r0", 8, max_tokens=16))
    for _ in range(14):
        step(s)
    s.add_request(req("r1", 20, max_tokens=8, arrival=1, first=500))  # ends at 28 tokens = 7 blocks
    assert s.kv.pool.num_free_blocks == 6  # r0 holds 6: r1's 7 blocks exceed what is free today
    step(s)
    assert running(s) == ["r0", "r1"]
    while s.has_unfinished_requests():
        step(s)
    assert s.stats.num_preemptions == 0


def test_no_starvation_a_short_later_request_does_not_overtake_a_waiting_one():
    s = make()
    s.add_request(req("long0", 8, max_tokens=16, first=100))
    s.add_request(req("long1", 8, max_tokens=16, arrival=1, first=200))
    s.add_request(req("big", 8, max_tokens=30, arrival=2, first=300))  # 38 tokens: waits for both to end
    s.add_request(req("tiny", 1, max_tokens=1, arrival=3, first=400))  # would fit, but arrived after "big"
    order = []
    while s.has_unfinished_requests():
        out = step(s)
        order += [x.req.request_id for x in out.scheduled if x.num_computed_tokens == 0]
    assert order == ["long0", "long1", "big", "tiny"] and s.stats.num_preemptions == 0


def test_no_deadlock_when_one_request_needs_the_whole_cache():
    s = make(num_blocks=9)  # 8 usable blocks = 32 tokens
    s.add_request(req("small", 4, max_tokens=4, first=100))
    s.add_request(req("whole", 8, max_tokens=24, arrival=1, first=200))  # 32 tokens: every block
    s.add_request(req("after", 4, max_tokens=4, arrival=2, first=300))
    for _ in range(100):
        if not s.has_unfinished_requests():
            break
        step(s)
    assert not s.has_unfinished_requests()
    assert s.stats.num_preemptions == 0 and s.kv.pool.num_free_blocks == 8


def test_request_projected_beyond_the_cache_runs_alone_and_ends_with_length():
    s = make(num_blocks=5)  # 4 usable blocks = 16 tokens; it wants 6 + 50
    r = req("a", 6, max_tokens=50)
    s.add_request(r)
    s.add_request(req("b", 2, max_tokens=2, arrival=1, first=100))
    for _ in range(60):
        if not s.has_unfinished_requests():
            break
        step(s)
    assert r.status == RequestStatus.FINISHED and str(r.finish_reason) == "length"
    assert not s.has_unfinished_requests() and s.kv.pool.num_free_blocks == 4


def test_early_stopping_requests_are_estimated_with_the_ratio():
    a = req("a", 8, max_tokens=100, eos=True)
    assert not output_length_known(a) and output_length_known(req("b", 8))
    assert KVAdmission("projected", 4, 64, 100, ratio=0.5).expected_remaining(a) == 50
    assert KVAdmission("projected", 4, 64, 100, ratio=1.0, ratio_after_preemption=1.0).expected_remaining(req("b", 8)) == 8


@pytest.mark.parametrize("ratio, admitted", [(1.0, 1), (0.2, 3)])
def test_ratio_setting_sets_how_many_may_stopping_requests_start(ratio, admitted):
    # 3 requests of 8 + up to 40 tokens (may stop at EOS) in 16 blocks of 4: at ratio 1 each projects 48 tokens
    s = make(kv_admission_ratio=ratio, kv_admission_ratio_after_preemption=1.0)
    for i in range(3):
        s.add_request(req(f"r{i}", 8, max_tokens=40, arrival=i, eos=True, first=100 * i))
    step(s)
    assert len(s.running) == admitted


def test_ratio_rises_after_a_preemption_and_decays_back():
    # greedy admission overfills the cache (so a preemption happens); the ratio is kept either way
    s = make(kv_admission_ratio=0.3, kv_admission_ratio_after_preemption=0.8, kv_admission="greedy")
    for i in range(3):
        s.add_request(req(f"r{i}", 8, max_tokens=16, arrival=i, first=100 * i))
    adm = s.admission
    assert adm.ratio == 0.3
    while not s.stats.num_preemptions:
        step(s)
    assert adm.ratio == 0.8
    for _ in range(300):
        adm.on_step(0)
    assert adm.ratio == pytest.approx(0.55)  # half way back over 300 of 600 steps
    for _ in range(400):
        adm.on_step(0)
    assert adm.ratio == pytest.approx(0.3)


def test_ratio_above_ratio_after_preemption_is_refused_naming_both():
    with pytest.raises((ConfigError, ValueError), match="kv_admission_ratio=.*kv_admission_ratio_after_preemption"):
        OctavoSettings.from_kwargs(kv_admission_ratio=0.8, kv_admission_ratio_after_preemption=0.5)
    with pytest.raises((ConfigError, ValueError), match="kv_admission"):
        OctavoSettings.from_kwargs(kv_admission="optimistic")


def test_early_stops_free_room_for_waiting_requests():
    # requests that may stop: at ratio 1.0 one runs at a time; when it stops at EOS the next one starts
    s = make(kv_admission_ratio=1.0, kv_admission_ratio_after_preemption=1.0)
    for i in range(3):
        s.add_request(req(f"r{i}", 8, max_tokens=40, arrival=i, eos=True, first=100 * i))
    step(s)
    assert running(s) == ["r0"]
    step(s, stop={"r0"})
    step(s)
    assert running(s) == ["r1"]


def test_prefix_hits_do_not_count_as_new_blocks():
    # r1 shares r0's 2 full prompt blocks: its projection needs only its own tail
    s = make(num_blocks=13, enable_prefix_caching=True)  # 12 usable blocks
    s.add_request(req("r0", 9, max_tokens=15))  # 24 tokens = 6 blocks
    step(s)
    s.add_request(req("r1", 9, max_tokens=15, arrival=1))  # same prompt: 2 hit blocks, 4 more at its end
    step(s)
    assert running(s) == ["r0", "r1"] and s.stats.prefix_cache_hits == 8
    while s.has_unfinished_requests():
        step(s)
    assert s.stats.num_preemptions == 0


def test_skipping_a_repeated_failed_check_changes_no_decision():
    # mixed known / early-stopping lengths; one scheduler rebuilds the projection at every check
    import random

    rng = random.Random(0)
    work = [(rng.randint(2, 12), rng.randint(1, 20), rng.random() < 0.5, rng.randint(1, 20)) for _ in range(40)]
    logs = []
    for cached in (True, False):
        s = make(num_blocks=25, max_num_batched_tokens=16)
        if not cached:
            def begin(running, held, version, waiting=(), begin_step=s.admission.begin_step):
                begin_step(running, held, object(), waiting)  # a new version every step: never skips a check

            s.admission.begin_step = begin
        for i, (n, m, eos, _) in enumerate(work):
            s.add_request(req(f"r{i}", n, max_tokens=m, arrival=i, eos=eos, first=1000 * i))
        stops = {f"r{i}": stop for i, (_, _, eos, stop) in enumerate(work) if eos}
        log = []
        while s.has_unfinished_requests():
            out = s.schedule()
            log.append([(x.req.request_id, x.num_tokens) for x in out.scheduled])
            s.update(out, {x.req.request_id: EOS if stops.get(x.req.request_id) == x.req.num_output_tokens + 1
                           else 7 for x in out.scheduled if x.samples})
        logs.append(log)
    assert logs[0] == logs[1] and len(logs[0]) > 40


def test_priority_request_outranking_a_running_one_starts_when_its_blocks_are_free():
    # a low-priority request runs; an equal-priority one waits for headroom, a higher-priority one starts now
    # and the low-priority request is the one preempted when the cache runs short
    s = make(scheduling_policy="priority")
    p = SamplingParams(max_tokens=40, ignore_eos=True)
    low = Request(EngineCoreRequest("low", list(range(100, 108)), p, 0.0, 5, eos_token_id=EOS), 40)
    peer = Request(EngineCoreRequest("peer", list(range(200, 208)), p, 1.0, 5, eos_token_id=EOS), 40)
    s.add_request(low)
    s.add_request(peer)
    step(s)
    assert running(s) == ["low"]  # 48 tokens each: two do not fit 64
    high = Request(EngineCoreRequest("high", list(range(300, 308)), p, 2.0, 0, eos_token_id=EOS), 40)
    s.add_request(high)
    step(s)
    assert set(running(s)) == {"low", "high"}
    while "high" in s.requests:
        step(s)
    assert low.num_preemptions >= 1 and high.num_preemptions == 0


def test_schedule_sim_small_run_projected_never_preempts_greedy_does():
    # benchmarks/schedule_sim.py on a small copy of the 512 x 1000/1000 shape: 24 x 100/100 in a 2,400-token cache
    import argparse
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import schedule_sim

    res = {}
    for admission in ("greedy", "projected"):
        args = argparse.Namespace(workload="fixed", prompts=24, in_len=100, out_len=100, kv_blocks=151, block_size=16,
                                  max_num_seqs=24, max_num_batched_tokens=512, max_model_len=512, prefix_caching=True,
                                  async_scheduling=True, admission=admission, ratio=0.1, ratio_after_preemption=0.7,
                                  seed=0)
        sim = schedule_sim.simulate(args)
        res[admission] = (sum(s[4] for s in sim["steps"]), sum(s[1] for s in sim["steps"]), args.total_out)
    assert res["projected"] == (0, 2400, 2400) and res["greedy"][0] > 0 and res["greedy"][1] > 2400, res


def _last_wave(overcommit, n):
    """``n`` requests of 8 + 16 tokens (6 blocks each at the end) in 100 usable blocks: 16 fit by projection."""
    s = make(num_blocks=101, max_num_batched_tokens=256, kv_admission_overcommit=overcommit)
    for i in range(n):
        s.add_request(req(f"r{i}", 8, max_tokens=16, arrival=i, first=100 * i))
    step(s)
    return s


def test_last_wave_overcommit_starts_the_rest_of_a_short_queue_and_loses_no_token():
    s = _last_wave(0.1, 17)  # X = 10 blocks; the 17th overshoots the projection by 2 and nothing waits behind it
    assert len(s.running) == 17 and not s.waiting
    outs = {}
    while s.has_unfinished_requests():
        out = step(s)
        outs.update({x.req.request_id: x.req for x in out.scheduled})
    assert all(len(r.output_token_ids) == 16 for r in outs.values()) and len(outs) == 17
    assert s.kv.pool.num_free_blocks == 100 and 1 <= s.stats.num_preemptions <= 2  # the overshoot, recomputed


def test_last_wave_overcommit_leaves_a_long_queue_and_off_alone():
    assert len(_last_wave(0.0, 17).running) == 16  # off: the 17th waits for room
    s = _last_wave(0.1, 19)  # the 17th has 2 x 6 blocks behind it, more than X = 10: waves as without it
    assert len(s.running) == 16 and len(s.waiting) == 3
    with pytest.raises((ConfigError, ValueError), match="kv_admission_overcommit"):
        OctavoSettings.from_kwargs(kv_admission_overcommit=0.5)
    with pytest.raises(ValueError, match="kv_admission_overcommit"):
        KVAdmission("projected", 4, 64, 100, overcommit=-0.1)
    from octavo.core.kv_admission import OVERCOMMIT_MAX_TAIL

    a = KVAdmission("projected", 4, 64, 100_000, overcommit=0.25)  # X = 25,000 blocks: room for any short queue
    short = [req(f"q{i}", 2, max_tokens=2) for i in range(OVERCOMMIT_MAX_TAIL + 1)]  # 1 block each at the end
    a._waiting = short[:OVERCOMMIT_MAX_TAIL]
    assert a._overcommit_room(short[0]) == 25_000 - (OVERCOMMIT_MAX_TAIL - 1)
    a._waiting = short  # one more than it looks at: no bonus, however small the queue's blocks
    assert a._overcommit_room(short[0]) == 0
