"""Admission pacing (core/kv_pacing.py): the light schedule model, the rate it chooses, and the real Scheduler with
pacing on: it never starts what the projected check refuses (no preemption), never lengthens a schedule the
model rejects, leaves queues that fit (or whose lengths are unknown) alone, and refuses bad settings by name."""

import pytest

from octavo.config import ConfigError, OctavoSettings
from octavo.core import kv_pacing
from octavo.core.kv_cache.manager import KVCacheManager
from octavo.core.messages import EngineCoreRequest
from octavo.core.request import Request
from octavo.core.scheduler import Scheduler
from octavo.sampling_params import SamplingParams


def run(pacing, num_blocks, n=64, prompt=40, out=40, eos=False, budget=256):
    """Steps, preemptions, largest decode batch and the rates chosen for ``n`` requests on a cache of
    ``num_blocks`` blocks of 4, one schedule + update a step (each request samples token 7, or EOS at its
    ``out``-th token when ``eos``: then its length is unknown to the scheduler)."""
    settings = OctavoSettings.from_kwargs(block_size=4, enable_prefix_caching=False, max_num_batched_tokens=budget,
                                          max_num_seqs=512, kv_admission_pacing=pacing)
    s = Scheduler(settings, KVCacheManager(num_blocks, 4, False), 4096)
    for i in range(n):
        p = SamplingParams(max_tokens=out if not eos else 4 * out, ignore_eos=not eos)
        s.add_request(Request(EngineCoreRequest(f"r{i}", [3 + (i * 7 + j) % 900 for j in range(prompt)], p, float(i),
                                                0, eos_token_id=2), p.max_tokens))
    steps, widest = 0, 0
    while s.has_unfinished_requests():
        o = s.schedule()
        widest = max(widest, sum(1 for x in o.scheduled if x.num_tokens == 1))
        s.update(o, {x.req.request_id: 2 if eos and x.req.num_output_tokens + 1 == out else 7
                     for x in o.scheduled if x.samples})
        steps += 1
        assert steps < 100_000
    return steps, s.stats.num_preemptions, widest, s.admission.pacer.episodes


def test_play_counts_waves_and_a_paced_schedule():
    # capacity for 2 requests of 10 + 10 at their ends: 6 requests run as 3 waves of 10 steps
    waiting = [(10, 10)] * 6
    assert kv_pacing.play(40, [], waiting, per_step=8, rate=0.0) == 30
    # everything fits at once: one wave whatever the rate
    assert kv_pacing.play(10_000, [], waiting, per_step=8, rate=0.0) == 10
    assert kv_pacing.play(10_000, [], waiting, per_step=8, rate=1.2) == 10
    # a running request occupies the cache until it ends: the first wave starts after it
    assert kv_pacing.play(20, [(10, 5)], [(10, 10)], per_step=8, rate=0.0) == 15


def test_choose_paces_the_8b_run_and_not_where_the_model_sees_no_gain():
    waiting = [(1000, 1000)] * 512
    # the H100's bf16 cache (26,970 blocks of 16): the waves take 3,009 model steps, a qualifying rate fewer
    rate = kv_pacing.choose(26_970 * 16, [], waiting, 8)
    assert rate in kv_pacing.RATES
    assert kv_pacing.play(26_970 * 16, [], waiting, 8, rate) <= 0.97 * kv_pacing.play(26_970 * 16, [], waiting, 8, 0.0)
    # 25,000 blocks: no rate saves 3 % in the model: no pacing
    assert kv_pacing.choose(25_000 * 16, [], waiting, 8) == 0.0


def test_scheduler_paces_without_preemption_and_in_fewer_steps():
    # 32 requests of 40 + 160 tokens (50 blocks of 4 each at the end) on 500 blocks: ~10 at once
    off = run("off", 500, n=32, out=160)
    auto = run("auto", 500, n=32, out=160)
    assert off[1] == 0 and auto[1] == 0  # the projected check still decides every start
    assert off[3] == [] and len(auto[3]) >= 1 and auto[3][0] > 0  # auto chose a rate for this queue
    assert auto[0] < off[0] and auto[2] > off[2]  # fewer, wider steps
    fixed = run("1.0", 500, n=32, out=160)
    assert fixed[1] == 0 and fixed[3][0] == 1.0


def test_short_outputs_are_not_paced():
    # 40-token outputs: below MIN_STEPS the model is not trusted (it ignores how prompts split across steps)
    assert run("auto", 300)[3] == [0.0]


def test_queues_that_fit_or_have_unknown_lengths_are_not_paced():
    assert run("auto", 4000)[3] == []  # the whole queue fits: never an episode
    off, auto = run("off", 300, eos=True), run("auto", 300, eos=True)
    assert auto[:3] == off[:3] and auto[3] == []


@pytest.mark.parametrize("value", ["fast", "0.1", "9"])
def test_bad_setting_is_refused_by_name(monkeypatch, value):
    with pytest.raises(ConfigError, match="kv_admission_pacing"):
        OctavoSettings.from_kwargs(kv_admission_pacing=value)
    monkeypatch.setenv("OCTAVO_KV_ADMISSION_PACING", value)
    with pytest.raises(ConfigError, match="kv_admission_pacing"):
        OctavoSettings.from_kwargs()


def test_setting_values(monkeypatch):
    assert OctavoSettings.from_kwargs().scheduler.kv_admission_pacing == "auto"
    assert OctavoSettings.from_kwargs(kv_admission_pacing="0").scheduler.kv_admission_pacing == "off"
    monkeypatch.setenv("OCTAVO_KV_ADMISSION_PACING", "1.2")
    assert OctavoSettings.from_kwargs().scheduler.kv_admission_pacing == "1.2"


def test_a_long_queue_is_planned_on_its_head_only():
    # 1,000 requests on a cache that holds ~7 at their ends: the model plays only the head (PLAN_SPAN caches'
    # worth), the run still never preempts, and the model ran at most once per REPLAN_STEPS
    steps, preempted, _, episodes = run("auto", 300, n=1000)
    assert preempted == 0 and 1 <= len(episodes) <= steps // kv_pacing.REPLAN_STEPS + 1


def test_greedy_admission_refuses_pacing_and_overcommit_it_would_ignore():
    """Pacing and the last-wave overcommit live in the projected check: with kv_admission='greedy' a value set
    for them is refused by name, never accepted and ignored; unset (their defaults) or off is fine."""
    with pytest.raises(ConfigError, match="kv_admission_pacing"):
        OctavoSettings.from_kwargs(kv_admission="greedy", kv_admission_pacing="1.2")
    with pytest.raises(ConfigError, match="kv_admission_overcommit"):
        OctavoSettings.from_kwargs(kv_admission="greedy", kv_admission_overcommit=0.1)
    assert OctavoSettings.from_kwargs(kv_admission="greedy").scheduler.kv_admission == "greedy"
    assert OctavoSettings.from_kwargs(kv_admission="greedy", kv_admission_pacing="off",
                                      kv_admission_overcommit=0).scheduler.kv_admission == "greedy"
