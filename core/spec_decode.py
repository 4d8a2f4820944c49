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


class SpeculativeDecoding:
    """Owns the proposer in the engine core: built and checked once at start, asked for drafts after
    every step for the requests that are decoding.

    Policy: a step whose running batch has ``disable_by_batch_size`` requests or more gets no drafts (at
    large batches the step is compute bound and verifying k extra tokens per request costs more than it
    saves); 0 never switches speculation off.
    """

    @staticmethod
    def resolve(settings, pm):
        """The config and proposer class, checked before any model loads (unknown or unimplemented
        methods fail fast)."""
        from octavo.speculator import HEAD_METHODS, SpeculativeConfig

        cfg = SpeculativeConfig.model_validate(settings.scheduler.speculative_config)
        if cfg.method not in pm.names("speculators") and cfg.method in HEAD_METHODS:
            raise ValueError(
                f"speculative_config method {cfg.method!r} (a head on the target's hidden states) is not "
                f"implemented in octavo; implemented methods: {pm.names('speculators')}. Use 'ngram' or "
                "'draft_model', or install a plugin that registers it (docs/spec_decode.md).")
        cls = pm.resolve("speculators", cfg.method)  # unknown: UnknownPluginError naming the registered ones
        if settings.model.task == "embed":
            raise ValueError("speculative_config needs a generating model; task='embed' produces no tokens")
        return cfg, cls

    def __init__(self, settings, pm, *, platform, vocab_size: int, max_model_len: int) -> None:
        from octavo.speculator import SpecContext

        cfg, cls = self.resolve(settings, pm)
        cls.check(cfg, settings, platform, vocab_size)
        self.config = cfg
        self.vocab_size = vocab_size
        self.disable_by_batch_size = cfg.disable_by_batch_size
        context = SpecContext(platform=platform, vocab_size=vocab_size, max_model_len=max_model_len,
                              load_draft_model=lambda c: _load_draft_model(settings, platform, c, vocab_size,
                                                                           max_model_len))
        self.proposer = cls(num_speculative_tokens=cfg.num_speculative_tokens, config=cfg, settings=settings,
                            context=context)
        self.name = cfg.method

    def propose(self, scheduler) -> None:
        """Fill ``scheduler.spec_drafts`` for the next schedule()."""
        from octavo.speculator import SpecRequest

        scheduler.spec_drafts = {}
        running = scheduler.running
        if not running or (self.disable_by_batch_size and len(running) >= self.disable_by_batch_size):
            return
        k = self.config.num_speculative_tokens
        asks = []
        for r in running:
            if r.pooling or r.num_tokens - r.num_computed_tokens != 1:
                continue  # prefilling (or recomputing after preemption): nothing to verify yet
            if getattr(r.sampling_params, "structured_outputs", None) is not None:
                continue  # a grammar would have to advance per draft: such requests decode one by one
            room = min(k, r.max_tokens - r.num_output_tokens - 1, scheduler.max_model_len - r.num_tokens - 1)
            if room > 0:
                asks.append(SpecRequest(r.request_id, list(r.all_token_ids), r.num_prompt_tokens, room))
        if not asks:
            return
        proposals = self.proposer.propose(asks)
        if not isinstance(proposals, list) or len(proposals) != len(asks):
            raise RuntimeError(f"speculator {self.name!r} returned {type(proposals).__name__} of "
                               f"{len(proposals) if isinstance(proposals, list) else '?'} proposals for "
                               f"{len(asks)} requests; it must return one list per request")
        for ask, drafts in zip(asks, proposals):
            if len(drafts) > ask.max_num_drafts or any(not (isinstance(t, int) and 0 <= t < self.vocab_size)
                                                       for t in drafts):
                raise RuntimeError(f"speculator {self.name!r} proposed {drafts[:8]!r} for request "
                                   f"{ask.request_id}: at most {ask.max_num_drafts} token ids in "
                                   f"[0, {self.vocab_size}) are allowed")
            if drafts:
                scheduler.spec_drafts[ask.request_id] = list(drafts)

    def release(self, request_ids: list[str]) -> None:
        self.proposer.release(request_ids)


def _load_draft_model(settings, platform, config, vocab_size: int, max_model_len: int):
    from octavo.core.spec_decode_draft import load_draft_model

    return load_draft_model(settings, platform, config, vocab_size, max_model_len)


def verify_on_device(logits, sample_reqs: list, drafts: list[list[int]], vocab_size: int, device,
                     generators: dict) -> dict:
    """The runner's sampling step when some request carries drafts: ``logits`` has ``k + 1`` rows per
    request (``k = len(drafts[i])``). Returns device tensors to copy to the host: each row's token and
    accept flag, and (when asked) logprobs of the raw distribution for each row's token."""
    from octavo.core.input_batch import build_sampling_batch
    from octavo.core.rejection_sampler import verify
    from octavo.core.sampler import compute_logprobs, gather_logprobs

    rows = expand_for_verification(sample_reqs, drafts)
    b = build_sampling_batch(rows, vocab_size, device, generators)
    raw = compute_logprobs(logits) if b.max_num_logprobs >= 0 else None
    out = verify(logits, b, [len(d) for d in drafts], drafts)
    pending = {"row_tokens": out.row_tokens, "accepted": out.accepted}
    if raw is not None:
        pending["lp_ids"], pending["lp"], pending["ranks"] = gather_logprobs(raw, out.row_tokens, b.max_num_logprobs)
    return pending


def emitted_tokens(host: dict, drafts: list[list[int]]) -> list[tuple[int, list[int]]]:
    """Per request (in sample order): (its first row, the tokens it emits this step)."""
    from octavo.core.rejection_sampler import split_emitted

    return split_emitted(host["row_tokens"].tolist(), host["accepted"].tolist(), [len(d) for d in drafts])


def fill_runner_output(result, host: dict, sample_req_ids: list[str], drafts: list[list[int]], reqs: dict,
                       row_logprobs) -> None:
    """Put each request's emitted tokens (and their logprobs, one entry per token) into ``result``, and
    write the accepted drafts into the runner's copy of each sequence: their K/V are in the cache and the
    scheduler's next step starts after them (it sends only the one new token)."""
    for rid, (r0, tokens) in zip(sample_req_ids, emitted_tokens(host, drafts)):
        result.sampled[rid] = tokens
        reqs[rid].all_token_ids.extend(tokens[:-1])
        want = reqs[rid].sampling_params.logprobs
        if want is not None:
            result.logprobs[rid] = [row_logprobs(host["lp_ids"][r0 + j], host["lp"][r0 + j],
                                                 int(host["ranks"][r0 + j]), want) for j in range(len(tokens))]


def first_logits_rows(drafts: list[list[int]], request_indices: list[int]) -> list[int]:
    """The logits row of each sampled request's first position (requests with drafts own k + 1 rows)."""
    if not drafts:
        return request_indices
    starts, r = [], 0
    for ds in drafts:
        starts.append(r)
        r += len(ds) + 1
    return [starts[i] for i in request_indices]
