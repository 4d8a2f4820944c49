"""Speculative decoding glue in the core: row expansion for verification, proposal bookkeeping, stats.

``expand_for_verification`` gives every position of a speculative request its own sampling row, as if the
drafts before it were accepted, so the sampler's parameters (penalties, ``min_tokens``, seeds) apply to
each position exactly as they would without speculation. Proposers see plain data only
(:class:`octavo.speculator.SpecRequest`), never core objects.
"""

from __future__ import annotations

from octavo.core.spec_verify import expand_for_verification  # noqa: F401  (re-exported: tests, older imports)


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
                f"registered (plugins disabled?); registered methods: {pm.names('speculators')} "
                "(docs/spec_decode.md).")
        cls = pm.resolve("speculators", cfg.method)  # unknown: UnknownPluginError naming the registered ones
        if getattr(cls, "runs_on_worker", False):  # a head: its checkpoint must exist before the target loads
            from octavo.spec_heads import checkpoint_dir, read_config

            read_config(checkpoint_dir(cfg.model))
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
        self.on_worker = bool(getattr(cls, "runs_on_worker", False))  # a head: drafts come in RunnerOutput

    def _switched_off(self, running) -> bool:
        return not running or bool(self.disable_by_batch_size and len(running) >= self.disable_by_batch_size)

    def annotate(self, batch, scheduler) -> None:
        """Ask the worker's head (if any) for drafts after this step, unless the batch-size policy is off."""
        if self.on_worker and not self._switched_off(scheduler.running):
            batch.num_spec_proposals = self.config.num_speculative_tokens

    def propose(self, scheduler, worker_drafts: dict[str, list[int]] | None = None) -> None:
        """Fill ``scheduler.spec_drafts`` for the next schedule(). ``worker_drafts``: what a head speculator
        proposed on the worker this step (``RunnerOutput.spec_token_ids``)."""
        from octavo.speculator import SpecRequest

        scheduler.spec_drafts = {}
        running = scheduler.running
        if self._switched_off(running):
            return
        worker_drafts = worker_drafts or {}
        k = self.config.num_speculative_tokens
        asks = []
        for r in running:
            if r.pooling or r.num_tokens - r.num_computed_tokens != 1:
                continue  # prefilling (or recomputing after preemption): nothing to verify yet
            if getattr(r.sampling_params, "structured_outputs", None) is not None:
                continue  # a grammar would have to advance per draft: such requests decode one by one
            room = min(k, r.max_tokens - r.num_output_tokens - 1, scheduler.max_model_len - r.num_tokens - 1)
            if room > 0 and (not self.on_worker or r.request_id in worker_drafts):
                asks.append(SpecRequest(r.request_id, list(r.all_token_ids), r.num_prompt_tokens, room,
                                        worker_drafts.get(r.request_id)))
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
