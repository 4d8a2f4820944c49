"""Speculative decoding glue in the core: row expansion for verification, proposal bookkeeping, stats.

``expand_for_verification`` gives every position of a speculative request its own sampling row, as if the
drafts before it were accepted, so the sampler's parameters (penalties, ``min_tokens``, seeds) apply to
each position exactly as they would without speculation. Proposers see plain data only
(:class:`octavo.speculator.SpecRequest`), never core objects.
"""

from __future__ import annotations


class DraftView:
    """A request seen after its first ``j`` drafts were accepted (what ``build_sampling_batch`` reads)."""

    __slots__ = ("request_id", "sampling_params", "eos_token_id", "output_token_ids", "all_token_ids")

    def __init__(self, req, drafts: list[int]) -> None:
        self.request_id = req.request_id
        self.sampling_params = req.sampling_params
        self.eos_token_id = req.eos_token_id
        self.output_token_ids = req.output_token_ids + drafts if drafts else req.output_token_ids
        self.all_token_ids = req.all_token_ids + drafts if drafts else req.all_token_ids

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


def expand_for_verification(reqs: list, drafts: list[list[int]]) -> list:
    """``k + 1`` sampling rows per request with ``k`` drafts (the request itself when ``k == 0``)."""
    rows = []
    for req, ds in zip(reqs, drafts):
        if not ds:
            rows.append(req)
            continue
        rows.extend(DraftView(req, ds[:j]) for j in range(len(ds) + 1))
    return rows


def record_verification(stats, num_draft: int, num_accepted: int, num_emitted: int) -> None:
    """Count one verification round in ``stats`` (a ``SchedulerStats``; cumulative counters)."""
    if num_draft <= 0:
        return
    stats.spec_decode_num_drafts += 1
    stats.spec_decode_num_draft_tokens += num_draft
    stats.spec_decode_num_accepted_tokens += num_accepted
    stats.spec_decode_num_emitted_tokens += num_emitted
    per_pos = list(stats.spec_decode_accepted_per_pos)  # replaced, not mutated: snapshots share the list
    per_pos.extend([0] * (num_draft - len(per_pos)))
    for j in range(num_accepted):
        per_pos[j] += 1
    stats.spec_decode_accepted_per_pos = per_pos
