"""The scheduler under async scheduling: counts move when a step is scheduled, tokens land one step later.

With ``async_scheduling`` the engine core schedules step N+1 while step N still runs, so it cannot wait for
N's tokens before deciding N+1. The base :class:`~octavo.core.scheduler.Scheduler` already schedules from
two counts; this subclass only changes when they move (vLLM's ``AsyncScheduler`` does the same):

    mark_scheduled(N)   num_computed_tokens += scheduled tokens; a request that samples in N gets one
                        *placeholder* (``Request.num_output_placeholders``): a token known to exist, value unknown
    schedule(N+1)       a decoding request asks for ``num_tokens + placeholders - num_computed_tokens`` = 1 token:
                        the placeholder itself, whose value the runner takes from N's sampled ids on the device
    update(N)           the placeholder becomes the real token (appended, stop checks as usual). A request that
                        finishes here may already sit in N+1: that step's token for it is never emitted
                        (``update`` skips finished requests), exactly as if N+1 had not run it.

Blocks of a request finished at N are freed at ``update(N)`` while N+1 may still write its one extra K/V slot
into them. That is safe because steps run in order on one stream / one worker thread: any later step that
reuses those blocks writes after N+1. The block holding that slot is never hashed for prefix caching (its
token was a placeholder when N+1 allocated it), so no other request can read the extra slot as a hit.

A request preempted while a step is in flight keeps its placeholder until that step's update; it is not
re-admitted before (``Scheduler.schedule``), so its recompute always starts from real tokens.
"""

from __future__ import annotations

from octavo.core.messages import FinishReason
from octavo.core.request import Request
from octavo.core.scheduler import Scheduler, SchedulerOutput


class AsyncScheduler(Scheduler):
    """:class:`Scheduler` whose counts advance at schedule time (see the module docstring)."""

    def mark_scheduled(self, out: SchedulerOutput) -> None:
        """Right after ``schedule()``: what the step will compute counts as computed, and each request that
        samples in it owes one placeholder token until :meth:`update`."""
        for s in out.scheduled:
            req = s.req
            req.num_computed_tokens = s.num_computed_tokens + s.num_tokens
            if s.samples and not req.pooling:
                req.num_output_placeholders += 1

    def update(self, out: SchedulerOutput, sampled: dict[str, int | list[int]]) -> list[tuple[Request, list[int]]]:
        """Turn the step's placeholders into tokens and finish requests that stop (``num_computed_tokens``
        already moved in :meth:`mark_scheduled`; a preemption since then has reset it, which stays)."""
        results = []
        for s in out.scheduled:
            req = s.req
            if s.samples and not req.pooling:
                req.num_output_placeholders -= 1
            if req.is_finished:  # finished by an earlier step (its extra token here is dropped) or aborted
                continue
            if s.num_computed_tokens + s.num_tokens <= req.num_prompt_tokens:
                self.stats.num_prompt_tokens += s.num_tokens
            if req.pooling:
                if s.samples:
                    self._finish(req, FinishReason.STOP)
                results.append((req, []))
                continue
            token = sampled.get(req.request_id)
            tokens = [token] if isinstance(token, int) else (token or [])
            results.append((req, self._append_tokens(req, tokens)))
        self.stats.num_steps += 1
        return results
