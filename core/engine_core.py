"""The engine core: the step loop over scheduler and executor, in whichever process runs it.

    step():  schedule -> execute -> update -> outputs

It speaks only token ids (messages in ``octavo.core.messages``); tokenization, detokenization and stop
strings live in the front end.
"""

from __future__ import annotations

import logging
import time

from octavo.config import OctavoSettings
from octavo.core.executor import make_executor
from octavo.core.kv_cache.manager import KVCacheManager, uniform_sliding_window
from octavo.core.loader import get_eos_token_ids
from octavo.core.messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    ModelInfo,
    SchedulerStats,
    TokenLogprobs,
)
from octavo.core.request import Request
from octavo.core.scheduler import Scheduler

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, settings: OctavoSettings) -> None:
        from octavo.core.plugin_manager import get_plugin_manager

        self.settings = settings
        self.pm = get_plugin_manager()
        self.platform = self.pm.select_platform(settings)
        self.executor = make_executor(settings, self.platform)
        w = self.executor.driver
        self.max_model_len = w.max_model_len
        self.kv = KVCacheManager(w.num_blocks, w.block_size, settings.cache.enable_prefix_caching,
                                 sliding_window=uniform_sliding_window(getattr(w, "model", None)))
        self.scheduler = Scheduler(settings, self.kv, self.max_model_len)
        self.max_logprobs = settings.scheduler.max_logprobs
        # prompt logprobs are gathered chunk by chunk and sent once, when the prompt is done
        self._prompt_lp: dict[str, dict[int, TokenLogprobs]] = {}
        eos_ids = get_eos_token_ids(w.resolved)
        self.model_info = ModelInfo(
            model=w.resolved.source,
            served_model_name=settings.model.served_model_name or settings.model.model or w.resolved.source,
            architecture=w.resolved.architecture,
            vocab_size=w.vocab_size,
            max_model_len=self.max_model_len,
            eos_token_id=(eos_ids[0] if eos_ids else None),
            eos_token_ids=eos_ids,
            is_pooling=w.runner.is_pooling,
            embedding_dim=getattr(w.model, "embedding_dim", None),
            tokenizer_path=getattr(w.resolved, "path", None),
            num_kv_blocks=w.num_blocks,
            block_size=w.block_size,
            dtype=str(w.dtype).split(".")[-1],
            device=str(w.device),
        )
        self.pm.hook.octavo_on_engine_start(settings=settings)
        self.stat_loggers = self.pm.stat_loggers(settings)

    # ---- requests ------------------------------------------------------------------------------
    def add_request(self, req: EngineCoreRequest) -> None:
        n = len(req.prompt_token_ids)
        if n == 0:
            raise ValueError(f"request {req.request_id}: the prompt is empty; give at least one token.")
        if n >= self.max_model_len and not req.pooling or n > self.max_model_len:
            raise ValueError(f"request {req.request_id}: the prompt has {n} tokens but max_model_len is "
                             f"{self.max_model_len}; shorten the prompt or raise --max-model-len.")
        bad = [t for t in req.prompt_token_ids if not 0 <= t < self.model_info.vocab_size]
        if bad:
            raise ValueError(f"request {req.request_id}: token ids {bad[:5]} are outside the vocabulary "
                             f"[0, {self.model_info.vocab_size}).")
        p = req.sampling_params
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(p, name)
            if k is not None and k > self.max_logprobs:
                raise ValueError(f"request {req.request_id}: {name}={k} exceeds max_logprobs={self.max_logprobs}; "
                                 "ask for fewer or start the engine with a larger --max-logprobs.")
        if req.request_id in self.scheduler.requests:
            raise ValueError(f"request id {req.request_id!r} is already running; use a unique id.")
        room = self.max_model_len - n
        max_tokens = room if p.max_tokens is None else min(p.max_tokens, room)
        self.scheduler.add_request(Request(req, max_tokens))

    def abort_requests(self, request_ids: list[str]) -> list[EngineCoreOutput]:
        outs = self.scheduler.abort(request_ids)
        for rid in request_ids:
            self._prompt_lp.pop(rid, None)
        self.executor.release(request_ids)
        return outs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> EngineCoreOutputs:
        sched_out = self.scheduler.schedule()
        early = [EngineCoreOutput(r.request_id, [], finish_reason=r.finish_reason)
                 for r in self.scheduler.finished_out_of_cache]
        if early:
            self.scheduler.finished_out_of_cache.clear()
            self.executor.release([o.request_id for o in early])
        if sched_out.is_empty:
            return EngineCoreOutputs(early, self.get_stats(), time.monotonic())
        result = self.executor.execute(sched_out)
        updates = self.scheduler.update(sched_out, result.sampled)
        outputs, finished = early, []
        for req, token in updates:
            rid = req.request_id
            if rid in result.prompt_logprobs and not req.prompt_logprobs_sent:
                first_pos, entries = result.prompt_logprobs[rid]
                acc = self._prompt_lp.setdefault(rid, {})
                for j, e in enumerate(entries):
                    acc.setdefault(first_pos + j, e)
            if token is None and not req.is_finished:
                continue  # a prefill chunk that produced nothing yet
            out = EngineCoreOutput(rid, [] if token is None else [token])
            if token is not None and rid in result.logprobs:
                out.new_logprobs = [result.logprobs[rid]]
            if req.sampling_params.prompt_logprobs is not None and not req.prompt_logprobs_sent:
                acc = self._prompt_lp.pop(rid, {})
                out.prompt_logprobs = [None] + [acc.get(i) for i in range(1, req.num_prompt_tokens)]
                req.prompt_logprobs_sent = True
            if req.num_cached_tokens > 0:
                out.num_cached_tokens = req.num_cached_tokens
            if rid in result.pooled:
                out.pooled = result.pooled[rid]
            if req.is_finished:
                out.finish_reason = req.finish_reason
                out.stop_reason = req.stop_reason
                finished.append(rid)
            outputs.append(out)
        if finished:
            self.executor.release(finished)
        stats = self.get_stats()
        for stat_logger in self.stat_loggers:
            stat_logger.record(stats, outputs)
        return EngineCoreOutputs(outputs, stats, time.monotonic())

    def shutdown(self) -> None:
        try:
            self.pm.hook.octavo_on_engine_shutdown(settings=self.settings)
        finally:  # a plugin that raises must not keep the workers alive
            self.executor.shutdown()


__all__ = ["EngineCore", "FinishReason"]
