"""The engine core thread's per-step Python of structured outputs, alone: ``prepare`` (the step's grammar rows) and
``accept_sampled`` (the step's tokens into the matchers), at batch 32, single thread, microseconds per step.

Why: on a small model's GPU step (~1.7 ms) this Python is host time on the critical path between two device steps
(issue 11; session 12 counted ~200 ``list.append`` and 32 each of ``is_finished`` / ``is_terminated`` /
``isinstance`` / ``dict.get`` per batch-32 step on the core thread). The backend is a stub (accept and fill do
nothing) so only the engine's own walk is timed; the requests, scheduled rows and runner output are the engine's
real classes, rebuilt every step as the scheduler and runner do. ``--impl FILE`` times another copy of
core/structured_output.py (e.g. ``git show HEAD~1:core/structured_output.py > /tmp/old.py``) in the same process,
alternating with the tree's by round, so the two are compared side by side.

    python benchmarks/structured_hostpath.py [--batch 32] [--steps 2000] [--rounds 7] [--impl /tmp/old.py]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import time
from concurrent.futures import Future


class _StubMatcher:
    __slots__ = ("terminated",)

    def __init__(self) -> None:
        self.terminated = False

    def is_terminated(self) -> bool:
        return self.terminated


class _StubBackend:
    """Accepts every token, fills nothing (the grammar library's cost is not what this times)."""

    def accept_tokens(self, matchers, tokens):
        return [True] * len(matchers)

    def fill_bitmasks(self, matchers, bitmask):
        pass


def _manager(mod, batch: int):
    from octavo.config import OctavoSettings

    settings = OctavoSettings.from_kwargs(max_num_seqs=batch)
    mgr = mod.StructuredOutputManager(settings, 49152, [2])
    mgr._backend = _StubBackend()
    return mgr


def _requests(mod, batch: int) -> list:
    from octavo.core.messages import EngineCoreRequest
    from octavo.core.request import Request, RequestStatus
    from octavo.sampling_params import SamplingParams

    reqs = []
    for i in range(batch):
        r = Request(EngineCoreRequest(f"req-{i}", [1, 2, 3], SamplingParams(max_tokens=10**6), 0.0), 10**6)
        r.status = RequestStatus.RUNNING
        fut: Future = Future()
        fut.set_result(object())
        g = r.grammar = mod.RequestGrammar(fut)
        g.start, g.matcher = 0, _StubMatcher()
        r.append_output_token(5)
        reqs.append(r)
    return reqs


def time_impl(mod, batch: int, steps: int) -> dict:
    """Median us per step of prepare and of accept_sampled over ``steps`` steps (each step's scheduled rows and
    runner output are new objects, as in the engine)."""
    from octavo.core.scheduler import ScheduledRequest, SchedulerOutput
    from octavo.step import RunnerOutput

    mgr = _manager(mod, batch)
    reqs = _requests(mod, batch)
    prep, acc, upd = [], [], []
    tok = 7
    accepted = [0]
    inner = mgr._backend.accept_tokens

    def counting(matchers, tokens):
        accepted[0] += len(matchers)
        return inner(matchers, tokens)
    mgr._backend.accept_tokens = counting
    for _ in range(steps):
        sched = SchedulerOutput([ScheduledRequest(r, 1, r.num_tokens - 1, [0]) for r in reqs], batch, batch)
        result = RunnerOutput(sampled={r.request_id: [tok] for r in reqs})
        t0 = time.perf_counter()
        g = mgr.prepare(sched)
        t1 = time.perf_counter()
        g._rows = (g.request_ids, g.positions, g.bitmask)  # (the fill is over: _close_inflight does not wait)
        t2 = time.perf_counter()
        mgr.accept_sampled(sched, result)
        t3 = time.perf_counter()
        updates = [(r, t[-1] if t else None) for r, t in ((r, result.sampled[r.request_id]) for r in reqs)]
        t4 = time.perf_counter()
        mgr.accept_tokens(updates)  # (what EngineCore._complete calls after Scheduler.update: nothing left here)
        t5 = time.perf_counter()
        prep.append(t1 - t0)
        acc.append(t3 - t2)
        upd.append(t5 - t4)
    assert mgr.stats["rows"] == steps * batch, mgr.stats  # every row was prepared and closed
    assert accepted[0] == steps * batch, accepted  # every token accepted once
    return {"prepare_us": statistics.median(prep) * 1e6, "accept_sampled_us": statistics.median(acc) * 1e6,
            "accept_tokens_us": statistics.median(upd) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--impl", default=None, help="another core/structured_output.py to time beside the tree's")
    args = ap.parse_args()
    from octavo.core import structured_output

    impls = {"tree": structured_output}
    if args.impl:
        spec = importlib.util.spec_from_file_location("structured_output_other", args.impl)
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        impls["impl"] = other
    gc.disable()  # (a collection inside one timed call is noise here, not the walk's cost)
    res = {name: {"prepare_us": [], "accept_sampled_us": [], "accept_tokens_us": []} for name in impls}
    for r in range(args.rounds):
        for name in (list(impls) if r % 2 == 0 else list(impls)[::-1]):
            out = time_impl(impls[name], args.batch, args.steps)
            for k, v in out.items():
                res[name][k].append(v)
    for name, d in res.items():
        med = {k: statistics.median(v) for k, v in d.items()}
        print(f"{name}: prepare {med['prepare_us']:.2f} + accept_sampled {med['accept_sampled_us']:.2f} + "
              f"accept_tokens {med['accept_tokens_us']:.2f} = {sum(med.values()):.2f} us per batch-{args.batch} step "
              f"(median of {args.rounds} rounds x {args.steps} steps; rounds: "
              + ", ".join(f"{k[:-3]} {[round(x, 1) for x in v]}" for k, v in d.items()) + ")")


if __name__ == "__main__":
    main()
