"""A step's grammar rows (which scheduled requests sample under a grammar), built by the structured-output manager's
``prepare`` and reused on the steady decode step (core/structured_output.py).

Why: on a small model's GPU step (~1.7 ms) the engine core thread's Python is host time between two device steps,
and session 12 counted its per-row walks (~200 ``list.append`` and 32 each of ``is_finished``, ``isinstance``,
``dict.get`` per batch-32 step). Here ``prepare`` reuses the last step's rows when the same requests are scheduled
in the same order, and ``accept_sampled`` takes the rows ``prepare`` made for that step instead of walking its
scheduled requests again; both fall back to the walk whenever it could pick other rows. benchmarks/
structured_hostpath.py times the forms side by side; tests/structured/test_hostpath_rows.py checks every case.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

ROWS_KEPT = 4  # prepared steps kept for accept_sampled (two in flight, + room; synchronous scheduling never asks)


class StepRows:
    """One engine core's rows: ``_of`` maps id(sched_out) to ``(sched_out, request ids, matchers, requests,
    complete)`` for the last prepared steps; ``complete``: every sampling request with a grammar had a matcher (then
    the rows cannot change later: a grammar is set once, at add_request, and a built matcher is never dropped).
    ``_last``: the last complete step's (requests, ``samples`` flags, positions, request ids, matchers, requests)."""

    __slots__ = ("_of", "_last")

    def __init__(self) -> None:
        self._of: dict[int, tuple] = {}
        self._last: tuple | None = None

    def build(self, sched_out: Any, active: Any) -> tuple[list[int], list[str], list[Any]]:
        """``(positions, request ids, matchers)`` of the requests of ``sched_out`` that sample under an active
        grammar; ``active(req)``: the request's matcher if its grammar applies now (it may build it), else None."""
        scheduled = sched_out.scheduled
        reqs, samples = [s.req for s in scheduled], [s.samples for s in scheduled]
        last = self._last
        if last is not None and last[0] == reqs and last[1] == samples:  # (list == compares identity first: C)
            positions, rids, matchers, row_reqs = last[2:]  # the same requests as the last step, matchers built
            complete = True
        else:
            positions, rids, matchers = [], [], []
            complete = True
            for i, s in enumerate(scheduled):
                g = s.req.grammar
                if g is None or not s.samples:
                    continue
                # a built matcher means the grammar compiled and has started (_active), the usual decode row: no
                # Future.done() lock and no start checks per row and step (host-bound GPU steps pay for each)
                m = g.matcher if g.matcher is not None else active(s.req)
                if m is not None:
                    positions.append(i)
                    rids.append(s.req.request_id)
                    matchers.append(m)
                else:
                    complete = False  # (its grammar starts later: this step's rows are not reusable)
            row_reqs = reqs if len(positions) == len(reqs) else [reqs[i] for i in positions]
            self._last = (reqs, samples, positions, rids, matchers, row_reqs) if complete else None
        rows_of = self._of
        rows_of[id(sched_out)] = (sched_out, rids, matchers, row_reqs, complete)
        if len(rows_of) > ROWS_KEPT:
            del rows_of[next(iter(rows_of))]
        return positions, rids, matchers

    def reqs_of(self, sched_out: Any) -> list:
        """The requests of the rows :meth:`build` made for ``sched_out``."""
        return self._of[id(sched_out)][3]

    def drop(self, sched_out: Any) -> None:
        """Forget ``sched_out``'s rows (its accept ran elsewhere: core/grammar_chain.py)."""
        self._of.pop(id(sched_out), None)

    def sampled(self, sched_out: Any, sampled: dict, failed: Any, prev: Any) -> tuple | None:
        """The usual step's ``(matchers, tokens, request ids, requests)`` to accept from the runner's ``sampled``:
        its prepared rows when each sampled a list of tokens, none is finished since, none failed and none was
        accepted already (``prev``); None otherwise (the caller walks the step's requests)."""
        rows = self._of.pop(id(sched_out), None)
        if rows is None or rows[0] is not sched_out or not rows[4] or failed or prev:
            return None
        _, rids, matchers, reqs, _ = rows
        toks = list(map(sampled.get, rids))
        if not all(map(isinstance, toks, repeat(list))) or [] in toks or any([r.is_finished for r in reqs]):
            return None
        return matchers, [t[-1] for t in toks], rids, reqs
