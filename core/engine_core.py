"""The engine core: the step loop over scheduler and executor, in whichever process runs it.

    step():  schedule -> execute -> update -> outputs

It speaks only token ids (messages in ``octavo.core.messages``); tokenization, detokenization and stop
strings live in the front end.
"""

from __future__ import annotations

import logging
import time

from octavo.config import OctavoSettings
from octavo.core.async_engine import AsyncStepLoop, StepTimers, pooling_off, resolve_async_scheduling
from octavo.core.async_scheduler import AsyncScheduler
from octavo.core.engine_start import announce_engine_start, begin_engine_start
from octavo.core.executor import make_executor
from octavo.core.kv_cache.manager import KVCacheManager
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
from octavo.core.sleep_mode import SleepControl
from octavo.core.spec_decode import SpeculativeDecoding
from octavo.core.step_builder import StepBuilder
from octavo.core.structured_output import StructuredOutputManager

logger = logging.getLogger(__name__)


class EngineCore:
    def __new__(cls, settings: OctavoSettings, *args, **kwargs):
        # data_parallel_size > 1: the same interface over N engine-core replicas (core/dp_engine_core.py)
        if cls is EngineCore and getattr(settings.parallel, "data_parallel_size", 1) > 1:
            from octavo.core.dp_engine_core import DPEngineCore

            return DPEngineCore(settings)
        return super().__new__(cls)

    def __init__(self, settings: OctavoSettings) -> None:
        from octavo.core.plugin_manager import get_plugin_manager

        begin_engine_start()  # start-phase timers, logged by announce_engine_start (core/engine_start.py)
        self.settings = settings
        self.pm = get_plugin_manager()
        self.platform = self.pm.select_platform(settings)
        if settings.scheduler.speculative_config:  # an unknown or unrunnable method fails before any load
            SpeculativeDecoding.resolve(settings, self.pm)
        auto_async = settings.scheduler.async_scheduling is None  # default: on where supported (async_engine.py)
        resolve_async_scheduling(settings, self.pm, self.platform)  # True + unsupported fails before any load
        self.step_timers = StepTimers()
        self.executor = make_executor(settings, self.platform)
        pooling_off(self, auto_async)
        info = self.executor.worker_info  # everything the core knows about the model and cache comes from here
        self.max_model_len = info.max_model_len
        self.kv = KVCacheManager(info.num_blocks, info.block_size, settings.cache.enable_prefix_caching,
                                 sliding_window=info.sliding_window)
        self.scheduler = (AsyncScheduler if settings.scheduler.async_scheduling else Scheduler)(
            settings, self.kv, self.max_model_len)
        self.steps = StepBuilder()
        self.spec = SpeculativeDecoding(settings, self.pm, platform=self.platform, vocab_size=info.vocab_size,
                                        max_model_len=self.max_model_len) \
            if settings.scheduler.speculative_config else None
        self.structured = StructuredOutputManager(settings, info.vocab_size, info.eos_token_ids, self.platform)
        self.max_logprobs = settings.scheduler.max_logprobs
        # prompt logprobs are gathered chunk by chunk and sent once, when the prompt is done
        self._prompt_lp: dict[str, dict[int, TokenLogprobs]] = {}
        eos_ids = info.eos_token_ids
        self.model_info = ModelInfo(
            model=info.model_source,
            served_model_name=(settings.model.served_model_name or [None])[0] or settings.model.model
            or info.model_source,
            architecture=info.architecture,
            vocab_size=info.vocab_size,
            max_model_len=self.max_model_len,
            eos_token_id=(eos_ids[0] if eos_ids else None),
            eos_token_ids=eos_ids,
            is_pooling=info.is_pooling,
            embedding_dim=info.embedding_dim,
            pooler=dict(getattr(info, "pooler", None) or {}),
            tokenizer_path=info.tokenizer_path,
            num_kv_blocks=info.num_blocks,
            block_size=info.block_size,
            dtype=info.dtype,
            device=info.device,
            platform=self.platform.name,
            attention_backend=info.attention_backend or "",
            quantization=getattr(info, "quantization", None) or "",
        )
        announce_engine_start(self.pm, settings, self.platform, info)  # log + octavo_on_engine_start
        self.stat_loggers = self.pm.stat_loggers(settings)
        self.sleeper = SleepControl(self)  # sleep / wake_up (core/sleep_mode.py)
        self.async_loop = AsyncStepLoop(self) if settings.scheduler.async_scheduling else None
        if self.async_loop is None and settings.parallel.pipeline_parallel_size > 1:  # micro-batches in flight
            from octavo.core.pp_schedule import pipeline_depth, set_pipeline_depth

            set_pipeline_depth(self, pipeline_depth(self))

    # ---- requests ------------------------------------------------------------------------------
    def add_request(self, req: EngineCoreRequest) -> None:
        self.sleeper.check_awake()
        n = len(req.prompt_token_ids)
        if n == 0:
            raise ValueError(f"request {req.request_id}: the prompt is empty; give at least one token.")
        if n >= self.max_model_len and not req.pooling or n > self.max_model_len:
            raise ValueError(f"request {req.request_id}: the prompt has {n} tokens but max_model_len is "
                             f"{self.max_model_len}; shorten the prompt or raise --max-model-len.")
        ids, vocab = req.prompt_token_ids, self.model_info.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:  # C-speed scan first: the list is walked only to name the bad ids
            bad = [t for t in ids if not 0 <= t < vocab]
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
        request = Request(req, max_tokens)
        self.structured.add_request(request)  # validates now, compiles on its own thread
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> list[EngineCoreOutput]:
        outs = self.scheduler.abort(request_ids)
        for rid in request_ids:
            self._prompt_lp.pop(rid, None)
        self.steps.forget(request_ids)
        if self.spec is not None:
            self.spec.release(request_ids)
        return outs

    def has_unfinished_requests(self) -> bool:
        # async scheduling: a step still in flight counts (its outputs are not out yet)
        return self.scheduler.has_unfinished_requests() or (self.async_loop is not None and self.async_loop.busy)

    def get_stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> EngineCoreOutputs:
        if self.async_loop is not None:  # async_scheduling: step N+1 scheduled while N runs (core/async_engine.py)
            return self.async_loop.step()
        t0 = time.perf_counter()
        sched_out, early = self._schedule()
        if sched_out.is_empty:
            return EngineCoreOutputs(early, self.get_stats(), time.monotonic())
        batch = self.steps.build(sched_out)
        if self.spec is not None:
            self.spec.annotate(batch, self.scheduler)  # head speculators draft on the worker after this step
        grammar = self.structured.prepare(sched_out)  # bitmasks to fill, overlapped with the forward if it can
        t1 = time.perf_counter()
        result = self.executor.execute(batch) if grammar is None else self.executor.execute_structured(batch, grammar)
        t2 = time.perf_counter()
        out = self._complete(sched_out, result, early)
        self.step_timers.record(host_s=(t1 - t0) + (time.perf_counter() - t2), exec_s=t2 - t1)
        return out

    def _schedule(self):
        """``schedule()``, plus the requests that finished without a step (out of cache, grammar failed)."""
        sched_out = self.scheduler.schedule()
        early = [EngineCoreOutput(r.request_id, [], finish_reason=r.finish_reason)
                 for r in self.scheduler.finished_out_of_cache]
        for req, why in self.structured.pop_failed(self.scheduler.waiting):  # grammar failed to compile
            self.scheduler._finish(req, FinishReason.ERROR)
            early.append(EngineCoreOutput(req.request_id, [], finish_reason=FinishReason.ERROR, error=why))
        if early:
            self.scheduler.finished_out_of_cache.clear()
            self.steps.forget([o.request_id for o in early])
        return sched_out, early

    def _complete(self, sched_out, result, early: list[EngineCoreOutput], between=None) -> EngineCoreOutputs:
        """After the step ran: update the scheduler and grammars, build each request's output. ``between``
        (async scheduling, core/async_engine.py): called after the update, before the outputs are built; it
        launches the next step and returns that schedule's early outputs."""
        self.scheduler.stats.mm_items_encoded += result.mm_items_encoded  # multimodal encoder cache counters
        self.scheduler.stats.mm_encoder_cache_hits += result.mm_encoder_cache_hits
        for rid in result.failed:  # the runner could not serve it (e.g. its LoRA adapter): no tokens, an error
            result.sampled.pop(rid, None)
        updates = self.scheduler.update(sched_out, result.sampled)
        # structured requests get no drafts (core/spec_decode.py), so each has at most one new token
        self.structured.accept_tokens([(r, t[-1] if t else None) for r, t in updates])
        if between is not None:
            early = early + between()
        outputs, finished = early, []
        for req, tokens in updates:
            rid = req.request_id
            if rid in result.prompt_logprobs and not req.prompt_logprobs_sent:
                plp = result.prompt_logprobs[rid]
                first_pos, entries = plp.first_pos, plp.entries
                acc = self._prompt_lp.setdefault(rid, {})
                for j, e in enumerate(entries):
                    acc.setdefault(first_pos + j, e)
            if not tokens and not req.is_finished:
                continue  # a prefill chunk that produced nothing yet
            out = EngineCoreOutput(rid, tokens)
            if tokens and rid in result.logprobs:
                out.new_logprobs = result.logprobs[rid][:len(tokens)]  # a stop inside verified drafts cuts
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
        for rid, why in result.failed.items():
            req = self.scheduler.requests.get(rid)
            if req is not None and not req.is_finished:
                self.scheduler._finish(req, FinishReason.ERROR)
                outputs.append(EngineCoreOutput(rid, [], finish_reason=FinishReason.ERROR, error=why))
                finished.append(rid)
        if finished:
            self.steps.forget(finished)
        if self.spec is not None:
            self.spec.release(finished + [o.request_id for o in early])
            self.spec.propose(self.scheduler, result.spec_token_ids)  # drafts for the next step
        stats = self.get_stats()
        for stat_logger in self.stat_loggers:
            stat_logger.record(stats, outputs)
        return EngineCoreOutputs(outputs, stats, time.monotonic())

    # ---- vLLM's engine utilities: collective_rpc, sleep mode ---------------------------------------
    def collective_rpc(self, method, args=(), kwargs=None, timeout=None) -> list:
        if self.async_loop is not None:
            self.async_loop.wait_idle()  # never call into the worker while its step thread runs a step
        return self.executor.collective_rpc(method, args=list(args), kwargs=kwargs, timeout=timeout)

    def sleep(self, level: int = 1) -> dict:
        if self.async_loop is not None:
            self.async_loop.wait_idle()
        return self.sleeper.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleeper.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.sleeper.is_sleeping()

    def check_health(self) -> None:
        """Raise ``ExecutorError`` if a worker is gone (the core's loop calls this between steps, so an idle
        server notices a dead worker within seconds, not at the next request)."""
        self.executor.check_health()

    def shutdown(self) -> None:
        if self.async_loop is not None:
            self.async_loop.close()
        self.structured.shutdown()
        try:
            self.pm.hook.octavo_on_engine_shutdown(settings=self.settings)
        finally:  # a plugin that raises must not keep the workers alive
            self.executor.shutdown()


__all__ = ["EngineCore", "FinishReason"]
