"""Verification of speculative (draft) tokens: exact for greedy rows, rejection sampling for random rows.

A request with ``k`` draft tokens contributes ``k + 1`` logits rows, one per position::

    rows      : r0        r0+1      ...  r0+k-1      r0+k
    predicts  : after t   after d0       after dk-2  after dk-1     (t = the request's last known token)
    draft     : d0        d1             dk-1        -              (the bonus row has none)

The sampling batch has one row per logits row, each built as if the drafts before it were accepted (so
penalties, ``min_tokens`` and every other parameter see exactly the prefix they would see without
speculation); ``process_logits`` (the sampler's own) turns each row into the target distribution ``p``.

- greedy row: a draft is accepted iff it equals ``argmax p``; the first mismatch emits ``argmax p``.
- random row: draft ``d`` (proposed from ``q``; a deterministic proposer means ``q = one-hot(d)``) is
  accepted with probability ``min(1, p(d) / q(d))``; on rejection the token is drawn from
  ``norm(max(p - q, 0))``. If every draft is accepted, the bonus row draws from ``p``. This emits exactly
  ``p``'s distribution at every position (Leviathan et al. 2023; Chen et al. 2023).

Each request draws ``k`` uniforms and ``(k + 1) x V`` exponentials every step whatever is accepted, from its
own generator when seeded, so a seeded request reproduces. Everything is computed for all rows at once on
the device (one recovered token per row); the host only finds each request's first rejection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.core.sampler import SamplingBatch, process_logits


@dataclass
class VerifyOutput:
    row_tokens: torch.Tensor  # [R] the token each row emits if reached: its draft if accepted, else recovered
    accepted: torch.Tensor  # [R] bool; False on bonus rows


def verify(logits: torch.Tensor, b: SamplingBatch, num_draft: list[int], draft_token_ids: list[list[int]],
           draft_probs: torch.Tensor | None = None) -> VerifyOutput:
    """Verify the drafts of a batch of requests (rows laid out as in the module docstring).

    Args:
        logits: [R, V] raw target logits, R = sum(k_i + 1).
        b: the sampling batch with one row per logits row (``b.generators`` keyed by row; every row of a
            seeded request shares its generator).
        num_draft: k_i per request (0: an ordinary, non-speculative row).
        draft_token_ids: the drafts per request (len k_i each).
        draft_probs: [sum k_i, V] the proposer's distributions ``q`` (None: deterministic proposals).
    """
    logits = logits.float().clone()
    device = logits.device
    R, V = logits.shape
    greedy, probs = process_logits(logits, b)
    flat_drafts = [t for ds in draft_token_ids for t in ds]
    is_draft = torch.zeros(R, dtype=torch.bool)
    draft_rows, r = [], 0
    for k in num_draft:
        draft_rows.extend(range(r, r + k))
        r += k + 1
    if r != R:
        raise ValueError(f"verify: {R} logits rows but the drafts need {r}")
    is_draft[draft_rows] = True
    is_draft = is_draft.to(device)
    drafts = torch.full((R,), -1, dtype=torch.int64)
    drafts[draft_rows] = torch.tensor(flat_drafts, dtype=torch.int64)
    drafts = drafts.to(device)

    accepted = is_draft & (drafts == greedy)
    row_tokens = greedy
    if probs is not None:
        random_rows = b.temperature > 0
        rand_acc, rand_tok = _rejection_sample(probs, is_draft, drafts, draft_rows, draft_probs, b.generators,
                                               num_draft)
        accepted = torch.where(random_rows, rand_acc, accepted)
        row_tokens = torch.where(random_rows, rand_tok, greedy)
    row_tokens = torch.where(accepted, drafts, row_tokens)
    return VerifyOutput(row_tokens=row_tokens, accepted=accepted)


def _rejection_sample(probs, is_draft, drafts, draft_rows, draft_probs, generators, num_draft):
    """Accept flags and recovered tokens for every row, as if every row were random."""
    R, V = probs.shape
    device = probs.device
    q = torch.zeros_like(probs)
    if draft_rows:
        rows = torch.tensor(draft_rows, device=device)
        if draft_probs is None:
            q[rows, drafts[rows]] = 1.0
        else:
            q[rows] = draft_probs.to(device=device, dtype=probs.dtype)
    # uniforms (one per draft row) and exponentials (one row per row), per-request generator when seeded
    u = torch.empty(R, device=device)
    noise = torch.empty_like(probs)
    if len(generators) < R:
        u.uniform_()
        noise.exponential_()
    is_draft_row = set(draft_rows)
    for row, gen in sorted(generators.items()):
        if row in is_draft_row:  # ordinary rows draw exactly what the plain sampler draws
            u[row].uniform_(generator=gen)
        noise[row].exponential_(generator=gen)
    safe = drafts.clamp(min=0)
    p_d = probs.gather(1, safe.unsqueeze(1)).squeeze(1)
    q_d = q.gather(1, safe.unsqueeze(1)).squeeze(1)
    # accept iff u < p/q  <=>  u * q < p  (q(d) > 0 for a proposed token; u in [0, 1))
    accepted = is_draft & (u * q_d < p_d)
    residual = (probs - q).clamp(min=0)
    norm = residual.sum(-1, keepdim=True)
    # p == q on a row: rejection has probability 0 there; fall back to p so the row stays well defined
    residual = torch.where((norm > 0) & is_draft.unsqueeze(1), residual / norm.clamp(min=1e-30), probs)
    recovered = residual.div(noise).argmax(dim=-1)
    return accepted, recovered


def split_emitted(row_tokens: list[int], accepted: list[bool], num_draft: list[int]) -> list[tuple[int, list[int]]]:
    """Per request: (first row, emitted tokens) — the accepted drafts, then the first non-accepted row's
    token (a correction or the bonus). Always at least one token per request."""
    out, r = [], 0
    for k in num_draft:
        n = 0
        while n < k and accepted[r + n]:
            n += 1
        out.append((r, row_tokens[r:r + n + 1]))
        r += k + 1
    return out
