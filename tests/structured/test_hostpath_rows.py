"""The core thread's fast paths of structured outputs (session 13): ``prepare`` reusing the last step's rows and
``accept_sampled`` reusing the rows ``prepare`` made for that step must pick exactly the rows and tokens the per-row
walk picks, in every case that walk distinguishes: a request finished since it was scheduled, a failed one, one
without a sampled token, one whose grammar had not started at prepare, a terminated matcher, a non-sampling row, a
changed batch. A stub backend records every accept call; no model, no grammar library."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from octavo.config import OctavoSettings
from octavo.core.messages import EngineCoreRequest
from octavo.core.request import Request, RequestStatus
from octavo.core.scheduler import ScheduledRequest, SchedulerOutput
from octavo.core.structured_output import RequestGrammar, StructuredOutputManager
from octavo.sampling_params import SamplingParams
from octavo.step import RunnerOutput


class Matcher:
    def __init__(self, name: str) -> None:
        self.name, self.terminated, self.tokens = name, False, []

    def is_terminated(self) -> bool:
        return self.terminated

    def accept_token(self, token: int) -> bool:
        self.tokens.append(token)
        return True


class Backend:
    def __init__(self) -> None:
        self.calls: list[list[tuple[str, int]]] = []

    def accept_tokens(self, matchers, tokens):
        self.calls.append([(m.name, t) for m, t in zip(matchers, tokens)])
        return [m.accept_token(t) for m, t in zip(matchers, tokens)]

    def fill_bitmasks(self, matchers, bitmask):
        pass


def setup(n: int = 6, grammar: tuple = ()):
    mgr = StructuredOutputManager(OctavoSettings.from_kwargs(max_num_seqs=8), 64, [2])
    mgr._backend = Backend()
    reqs = []
    for i in range(n):
        r = Request(EngineCoreRequest(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=100), 0.0), 100)
        r.status = RequestStatus.RUNNING
        r.append_output_token(5)
        if not grammar or i in grammar:
            fut: Future = Future()
            fut.set_result(object())
            g = r.grammar = RequestGrammar(fut)
            g.start, g.matcher = 0, Matcher(f"r{i}")
        reqs.append(r)
    return mgr, reqs


def sched_of(reqs, not_sampling=()):
    out = []
    for r in reqs:
        s = ScheduledRequest(r, 1, r.num_tokens - 1, [0])
        if r.request_id in not_sampling:
            s.samples = False
        out.append(s)
    return SchedulerOutput(out, len(out), len(out))


def step(mgr, sched, sampled, failed=None) -> list[tuple[str, int]]:
    """prepare (its fill done at once), then accept_sampled; the (request, token) pairs accepted, in order."""
    g = mgr.prepare(sched)
    if g is not None:
        g._rows = (g.request_ids, g.positions, g.bitmask)
    mgr._backend.calls.clear()
    mgr.accept_sampled(sched, RunnerOutput(sampled=sampled, failed=failed or {}))
    return [c for call in mgr._backend.calls for c in call]


def updates_of(reqs, sampled):
    return [(r, sampled[r.request_id][-1] if sampled.get(r.request_id) else None) for r in reqs]


def test_steady_rows_reused_and_tokens_accepted_once():
    mgr, reqs = setup()
    sampled = {r.request_id: [10 + i] for i, r in enumerate(reqs)}
    first = sched_of(reqs)
    assert step(mgr, first, sampled) == [(f"r{i}", 10 + i) for i in range(6)]
    mgr._backend.calls.clear()
    mgr.accept_tokens(updates_of(reqs, sampled))  # after update: accept_sampled took them all
    assert mgr._backend.calls == []
    second = sched_of(reqs)  # new scheduled objects, same requests: prepare reuses the rows
    g = mgr.prepare(second)
    assert g.matchers is mgr._rows._last[4] and g.positions == list(range(6))
    g._rows = (g.request_ids, g.positions, g.bitmask)
    mgr._backend.calls.clear()
    mgr.accept_sampled(second, RunnerOutput(sampled={r.request_id: [20] for r in reqs}))
    assert [c for call in mgr._backend.calls for c in call] == [(f"r{i}", 20) for i in range(6)]


@pytest.mark.parametrize("case", ["finished", "failed", "missing", "empty"])
def test_each_skipped_row_alone(case):
    """Each reason the walk skips a row, alone in an otherwise steady step (so no other check hides it)."""
    mgr, reqs = setup()
    step(mgr, sched_of(reqs), {r.request_id: [1] for r in reqs})
    mgr.accept_tokens(updates_of(reqs, {r.request_id: [1] for r in reqs}))
    sched = sched_of(reqs)
    sampled = {r.request_id: [30 + i] for i, r in enumerate(reqs)}
    failed = {}
    if case == "finished":  # finished at the step before: its token here is never emitted
        reqs[3].status = RequestStatus.FINISHED
    elif case == "failed":
        failed = {"r3": "bad adapter"}
    elif case == "missing":
        del sampled["r3"]
    else:
        sampled["r3"] = []
    assert step(mgr, sched, sampled, failed) == [(f"r{i}", 30 + i) for i in range(6) if i != 3]
    mgr._backend.calls.clear()
    mgr.accept_tokens([(reqs[3], 33), (reqs[0], 30)])  # r0 was taken by accept_sampled; r3 is accepted here
    assert mgr._backend.calls == [[("r3", 33)]]


def test_int_tokens_and_rows_without_grammar_or_sampling():
    mgr, reqs = setup(grammar=(0, 2, 3, 5))
    sched = sched_of(reqs, not_sampling=("r3",))
    sampled = {r.request_id: 40 + i for i, r in enumerate(reqs)}  # plain ints (the walk's isinstance branch)
    assert step(mgr, sched, sampled) == [("r0", 40), ("r2", 42), ("r5", 45)]
    mgr.accept_tokens([(r, None if r.request_id == "r3" else sampled[r.request_id]) for r in reqs])  # (r3: no token)
    # the same requests, now r3 samples: prepare must not reuse the last rows
    sched2 = sched_of(reqs)
    sampled2 = {r.request_id: [50 + i] for i, r in enumerate(reqs)}
    assert step(mgr, sched2, sampled2) == [("r0", 50), ("r2", 52), ("r3", 53), ("r5", 55)]


def test_grammar_started_after_prepare_is_accepted_by_accept_sampled():
    mgr, reqs = setup()
    g1 = reqs[1].grammar
    g1.matcher, g1.start = None, None  # not started at prepare (e.g. the reasoning had not ended)
    mgr._active = lambda req: None  # (what _active says while the reasoning is open)
    sched = sched_of(reqs)
    g = mgr.prepare(sched)
    assert "r1" not in g.request_ids
    g._rows = (g.request_ids, g.positions, g.bitmask)
    g1.matcher, g1.start = Matcher("r1"), 0  # built by accept_tokens of the step before, after this prepare
    mgr._backend.calls.clear()
    mgr.accept_sampled(sched, RunnerOutput(sampled={r.request_id: [60 + i] for i, r in enumerate(reqs)}))
    assert [c for call in mgr._backend.calls for c in call] == [(f"r{i}", 60 + i) for i in range(6)]
    assert mgr._rows._last is None  # an incomplete step's rows are never reused by the next prepare


def test_changed_batch_and_terminated_matcher():
    mgr, reqs = setup()
    step(mgr, sched_of(reqs), {r.request_id: [1] for r in reqs})
    mgr.accept_tokens(updates_of(reqs, {r.request_id: [1] for r in reqs}))
    reqs[2].grammar.matcher.terminated = True  # accepted its stop token (ignore_eos goes on): takes no more tokens
    order = [reqs[5], reqs[0], reqs[2], reqs[4]]  # a different batch: rows rebuilt in its order
    got = step(mgr, sched_of(order), {r.request_id: [7] for r in order})
    assert got == [("r5", 7), ("r0", 7), ("r4", 7)]


def test_prev_step_not_consumed_falls_back_to_the_walk():
    mgr, reqs = setup()
    sampled = {r.request_id: [3] for r in reqs}
    step(mgr, sched_of(reqs), sampled)  # accept_tokens not called: these requests stay "already accepted"
    assert step(mgr, sched_of(reqs), sampled) == []


def test_kept_rows_are_bounded():
    mgr, reqs = setup()
    for _ in range(10):  # synchronous scheduling: prepare every step, accept_sampled never
        mgr.prepare(sched_of(reqs))
    assert len(mgr._rows._of) <= 4
