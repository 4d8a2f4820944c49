"""Turns the scheduler's output (live ``Request`` objects) into the data-only :class:`StepBatch`.

It remembers which requests the runner currently holds, so a request is described in full once
(``NewRequestData``) and later steps send only its tokens and block table; requests that finish or are
aborted are queued in ``finished_ids`` of the next batch, so the runner frees its state for them.

    schedule() ─▶ StepBuilder.build() ─▶ StepBatch ─▶ executor
    finish/abort ─▶ StepBuilder.forget(ids) ─▶ next StepBatch.finished_ids
"""

from __future__ import annotations

from octavo.core.scheduler import SchedulerOutput

# PLACEHOLDER: a token id the scheduler does not know yet (async scheduling); the runner fills it on the device
# from the previous step's sampled ids and patches its own copy of the sequence once that step's tokens are known
from octavo.step import PLACEHOLDER, NewRequestData, ScheduledRequestData, StepBatch


class StepBuilder:
    def __init__(self) -> None:
        self.known: set[str] = set()  # request ids whose state the runner holds
        self.pending_finished: list[str] = []

    def forget(self, request_ids: list[str]) -> None:
        """The runner may drop these requests' state (sent with the next batch)."""
        for rid in request_ids:
            if rid in self.known:
                self.known.discard(rid)
                self.pending_finished.append(rid)

    def build(self, out: SchedulerOutput) -> StepBatch:
        new: list[NewRequestData] = []
        scheduled: list[ScheduledRequestData] = []
        for s in out.scheduled:
            req = s.req
            rid = req.request_id
            if rid not in self.known:
                self.known.add(rid)
                new.append(NewRequestData(rid, req.prompt_token_ids, req.sampling_params, req.eos_token_id,
                                          req.pooling, req.lora_request, mm_inputs=req.mm_inputs))
            start = s.num_computed_tokens
            # NOTE: block_ids is the KV manager's live list; valid until the next schedule(). Executors
            # that send the batch elsewhere serialize it inside execute(), before that.
            num_known = s.num_tokens - len(s.spec_token_ids)  # the drafts travel apart from the known tokens
            token_ids = req.all_token_ids[start:start + num_known]
            if len(token_ids) < num_known:  # async scheduling: a token a step in flight samples (core/async_*.py)
                token_ids += [PLACEHOLDER] * (num_known - len(token_ids))
            scheduled.append(ScheduledRequestData(rid, token_ids, start, s.block_ids, s.samples, s.spec_token_ids))
        finished, self.pending_finished = self.pending_finished, []
        return StepBatch(scheduled, new, finished, out.num_decode_reqs, out.total_num_tokens)

    def flush(self) -> StepBatch | None:
        """A batch that only frees state (for an idle engine), or None when there is nothing to free."""
        if not self.pending_finished:
            return None
        finished, self.pending_finished = self.pending_finished, []
        return StepBatch(finished_ids=finished)
