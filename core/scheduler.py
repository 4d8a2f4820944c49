"""The scheduler: each step, give each request a number of tokens under one token budget.

There are no prefill and decode phases. A running request asks for ``num_tokens - num_computed_tokens``
tokens (1 while decoding, the rest of its prompt while prefilling); a waiting request asks for its prompt
minus its prefix-cache hit. Chunked prefill is just a smaller count. When blocks run out, the lowest-ranked
running request is preempted (its blocks freed, recomputed later from prompt + output so far), so nothing
it produced is lost.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field

from octavo.config import OctavoSettings
from octavo.core.kv_admission import KVAdmission
from octavo.core.kv_cache.manager import KVCacheManager
from octavo.core.messages import EngineCoreOutput, FinishReason, SchedulerStats
from octavo.core.request import Request, RequestStatus
from octavo.core.spec_decode import record_verification

logger = logging.getLogger(__name__)


@dataclass
class ScheduledRequest:
    req: Request
    num_tokens: int  # new tokens this step
    num_computed_tokens: int  # tokens already in the cache before this step
    block_ids: list[int]
    spec_token_ids: list[int] = field(default_factory=list)  # drafts to verify (counted in num_tokens)
    # True when this step reaches the end of the request's tokens (known ones plus the async placeholders),
    # so it yields a next token. Fixed when scheduled: async scheduling moves the counts before update().
    samples: bool = field(init=False)

    def __post_init__(self) -> None:
        self.samples = (self.num_computed_tokens + self.num_tokens
                        == self.req.num_tokens + self.req.num_output_placeholders + len(self.spec_token_ids))


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)  # decode-only requests first
    num_decode_reqs: int = 0
    total_num_tokens: int = 0
    preempted_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, settings: OctavoSettings, kv: KVCacheManager, max_model_len: int) -> None:
        sched = settings.scheduler
        self.kv = kv
        self.max_model_len = max_model_len
        self.max_num_seqs = sched.max_num_seqs
        self.max_loras = settings.lora.max_loras  # distinct LoRA adapters running at once (device slots)
        self.chunked_prefill = sched.enable_chunked_prefill
        self.max_num_batched_tokens = sched.max_num_batched_tokens or (
            max(2048, min(max_model_len, 8192)) if self.chunked_prefill else max_model_len)
        if not self.chunked_prefill and self.max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} < max_model_len={max_model_len} without "
                "chunked prefill: long prompts could never run. Enable chunked prefill or raise the budget.")
        self.policy = sched.scheduling_policy
        # when a waiting request may start (core/kv_admission.py): projected KV peak, or greedy
        self.admission = KVAdmission(sched.kv_admission, kv.block_size, self.max_num_batched_tokens,
                                     kv.num_usable_blocks, ratio=sched.kv_admission_ratio,
                                     ratio_after_preemption=sched.kv_admission_ratio_after_preemption,
                                     overcommit=sched.kv_admission_overcommit, pacing=sched.kv_admission_pacing)
        self.waiting: list[Request] = []  # kept sorted by policy
        self.running: list[Request] = []  # in schedule order: earlier = higher rank
        self.requests: dict[str, Request] = {}
        self.finished_out_of_cache: list[Request] = []  # finished inside schedule(); reported by the engine
        self.stats = SchedulerStats()
        # speculative decoding: request id -> drafts proposed after the last step, verified in the next one
        self.spec_drafts: dict[str, list[int]] = {}

    # ---- admission -------------------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        if req.num_tokens + (0 if req.pooling else 1) > self.kv.max_tokens_in_cache():
            raise ValueError(
                f"request {req.request_id}: {req.num_tokens} prompt tokens need more KV cache than exists "
                f"({self.kv.max_tokens_in_cache()} tokens in {self.kv.num_usable_blocks} blocks). Raise "
                "kv_cache_memory_bytes (or gpu_memory_utilization / num_gpu_blocks_override) or shorten the prompt.")
        if req.pooling and req.num_tokens > self.max_num_batched_tokens:
            raise ValueError(
                f"request {req.request_id}: an embedding input of {req.num_tokens} tokens exceeds "
                f"max_num_batched_tokens={self.max_num_batched_tokens}; raise it or shorten the input.")
        self.requests[req.request_id] = req
        self._enqueue_waiting(req)

    def _enqueue_waiting(self, req: Request) -> None:
        key = req.sort_key(self.policy)
        if not self.waiting or self.waiting[-1].sort_key(self.policy) <= key:  # arrival order: no O(n) key list
            self.waiting.append(req)
            return
        keys = [r.sort_key(self.policy) for r in self.waiting]
        self.waiting.insert(bisect.bisect_right(keys, key), req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling ------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        if self.policy == "priority":
            self.running.sort(key=lambda r: r.sort_key(self.policy))

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            drafts = self._usable_drafts(req, budget)
            num_new = min(self._num_to_compute(req), budget) + len(drafts)
            if num_new <= 0:  # async scheduling: its step in flight already ends it (core/async_scheduler.py)
                i += 1
                continue
            num_computed = req.num_computed_tokens
            while not self.kv.allocate_slots(req, num_new):
                victim = self.running.pop()  # the lowest-ranked request not yet scheduled this step
                if victim is req and not self.running:
                    # It holds every block alone and still needs more: it outgrew the whole cache (only
                    # possible when the cache is smaller than max_model_len). End it instead of looping.
                    logger.warning("request %s outgrew the KV cache (%d tokens); finishing it with 'length'. "
                                   "Give the cache more memory or lower max_model_len.", req.request_id,
                                   req.num_tokens)
                    self.running.append(req)
                    self._finish(req, FinishReason.LENGTH)
                    self.finished_out_of_cache.append(req)
                    break
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                scheduled.append(ScheduledRequest(req, num_new, num_computed, self.kv.block_ids(req.request_id),
                                                  drafts))
                budget -= num_new
                i += 1

        # Admit waiting requests only when nothing had to be preempted: a fresh admission would just be
        # the next victim. Each must also leave room for the running requests' projected growth.
        if not preempted and self.waiting and budget > 0:
            self.admission.begin_step(self.running, lambda r: len(self.kv.block_ids(r.request_id)),
                                      (len(self.requests), len(self.running), self.stats.num_preemptions),
                                      self.waiting)
        # priority policy: a request that outranks a running one starts if its blocks are free now; if the cache
        # runs short later, the lower-priority request is preempted (the projection protects peers, not them)
        lowest = max((r.priority for r in self.running), default=None) if self.policy == "priority" else None
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            # grammars compile off this loop; an adapter waits while max_loras others run
            # a request preempted while a step was in flight waits for that step's token (async scheduling)
            req = next((r for r in self.waiting if r.grammar_ready and self._lora_fits(r)
                        and not r.num_output_placeholders), None)
            if req is None:
                break
            hits, num_hit_tokens = self.kv.get_computed_blocks(req)
            num_new = req.num_tokens - num_hit_tokens
            if num_new > budget and (req.pooling or not self.chunked_prefill):
                break
            num_new = min(num_new, budget)
            num_hits_free = sum(1 for b in hits if b.ref_cnt == 0)  # they leave the free queue when taken
            outranks = lowest is not None and req.priority < lowest
            if not outranks and not self.admission.admits(req, self.kv.pool.num_free_blocks - num_hits_free,
                                                          len(hits)):
                break
            if not self.kv.allocate_slots(req, num_new, hits):
                break
            self.waiting.remove(req)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit_tokens
                self.stats.prefix_cache_queries += req.num_tokens
                self.stats.prefix_cache_hits += num_hit_tokens
            req.num_computed_tokens = num_hit_tokens
            self.admission.admitted(req, len(self.kv.block_ids(req.request_id)))
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append(ScheduledRequest(req, num_new, num_hit_tokens, self.kv.block_ids(req.request_id)))
            budget -= num_new

        self.admission.on_step(len(preempted))
        decodes = [s for s in scheduled if s.num_tokens == 1 and s.num_computed_tokens > 0]
        others = [s for s in scheduled if not (s.num_tokens == 1 and s.num_computed_tokens > 0)]
        return SchedulerOutput(decodes + others, len(decodes), self.max_num_batched_tokens - budget, preempted)

    def _num_to_compute(self, req: Request) -> int:
        """Tokens of a running request not yet scheduled: its known tokens plus the ones steps in flight will
        sample (async scheduling), minus those already computed or scheduled. A request those steps are sure
        to finish (max_tokens, max_model_len) gets 0: its next step could only produce a discarded token."""
        ph = req.num_output_placeholders
        if ph and (req.num_output_tokens + ph >= req.max_tokens or req.num_tokens + ph >= self.max_model_len):
            return 0
        return req.num_tokens + ph - req.num_computed_tokens

    def _lora_fits(self, req: Request) -> bool:
        """Whether ``req`` may join the running set: at most ``max_loras`` distinct adapters run at once."""
        lora = req.lora_request
        if lora is None:
            return True
        running = {r.lora_request.lora_int_id for r in self.running if r.lora_request is not None}
        return lora.lora_int_id in running or len(running) < self.max_loras

    def _usable_drafts(self, req: Request, budget: int) -> list[int]:
        """The drafts ``req`` verifies this step: only while decoding (one known token to compute), cut to
        the budget and so that neither ``max_tokens`` nor ``max_model_len`` can be overshot."""
        drafts = self.spec_drafts.pop(req.request_id, None)
        if not drafts or req.num_tokens - req.num_computed_tokens != 1:
            return []
        room = min(budget - 1, req.max_tokens - req.num_output_tokens - 1, self.max_model_len - req.num_tokens - 1)
        return drafts[:max(0, room)]

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.stats.num_preemptions += 1
        self._enqueue_waiting(req)
        logger.debug("preempted %s", req.request_id)

    # ---- after the model ran ---------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: dict[str, int | list[int]]) -> list[tuple[Request, list[int]]]:
        """Advance computed counts, append each sampled token and finish requests that stop.

        Returns ``(request, new tokens)`` for every scheduled request (several when drafts were accepted,
        none for a prefill chunk); requests that finished have ``finish_reason`` set and their blocks freed.
        """
        results = []
        for s in out.scheduled:
            req = s.req
            if req.is_finished:  # aborted between schedule and update
                continue
            token = sampled.get(req.request_id)
            tokens = [token] if isinstance(token, int) else (token or [])
            # rejected drafts' K/V slots are rolled back: only the accepted ones count as computed
            num_rejected = len(s.spec_token_ids) - max(0, len(tokens) - 1)
            req.num_computed_tokens = s.num_computed_tokens + s.num_tokens - num_rejected
            if req.num_computed_tokens <= req.num_prompt_tokens:
                self.stats.num_prompt_tokens += s.num_tokens
            if req.pooling:
                if s.samples:
                    self._finish(req, FinishReason.STOP)
                results.append((req, []))
                continue
            emitted = self._append_tokens(req, tokens)
            if s.spec_token_ids:
                record_verification(self.stats, len(s.spec_token_ids), len(tokens) - 1, len(emitted))
                if not req.is_finished:
                    self.kv.free_tail_blocks(req, req.num_tokens)
            results.append((req, emitted))
        self.stats.num_steps += 1
        return results

    def _append_tokens(self, req: Request, tokens: list[int]) -> list[int]:
        """Append tokens one by one, stopping at the first that finishes the request (later verified
        tokens are dropped, exactly as decoding them one per step would never have produced them)."""
        for n, token in enumerate(tokens, 1):
            req.append_output_token(token)
            self.stats.num_generation_tokens += 1
            self._check_stop(req, token)
            if req.is_finished:
                return tokens[:n]
        return tokens

    def _check_stop(self, req: Request, token: int) -> None:
        params = req.sampling_params
        if req.num_output_tokens >= params.min_tokens:
            if token == req.eos_token_id and not params.ignore_eos:
                return self._finish(req, FinishReason.STOP, None)
            if token in params.stop_token_ids:
                return self._finish(req, FinishReason.STOP, token)
        if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len:
            return self._finish(req, FinishReason.LENGTH)

    def _finish(self, req: Request, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.stop_reason = stop_reason
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req)
        self.requests.pop(req.request_id, None)

    def abort(self, request_ids: list[str]) -> list[EngineCoreOutput]:
        outs = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None:
                continue
            self._finish(req, FinishReason.ABORT)
            outs.append(EngineCoreOutput(rid, [], finish_reason=FinishReason.ABORT))
        return outs

    def make_stats(self) -> SchedulerStats:
        s = self.stats
        s.num_running_reqs = len(self.running)
        s.num_waiting_reqs = len(self.waiting)
        s.kv_cache_usage = self.kv.usage()
        return SchedulerStats(**{f: getattr(s, f) for f in s.__struct_fields__})
