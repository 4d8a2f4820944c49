"""A request as the engine core tracks it: token ids, how many are computed, its blocks, its status."""

from __future__ import annotations

import enum

from octavo.core.messages import EngineCoreRequest, FinishReason
from octavo.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # back in the waiting queue; its KV blocks were freed and will be recomputed
    FINISHED = 3


_FINISHED = RequestStatus.FINISHED  # (an Enum member read from its class costs ~0.1 us: is_finished runs per row)


class Request:
    """One sequence: its prompt, the tokens generated so far, and how much of it is in the KV cache.

    ``num_computed_tokens`` counts tokens whose K/V are in the cache; the scheduler moves it forward by the
    number of tokens it schedules, and a preemption resets it to 0 (recompute), keeping ``output_token_ids``.
    """

    def __init__(self, req: EngineCoreRequest, max_tokens: int) -> None:
        self.request_id = req.request_id
        self.prompt_token_ids: list[int] = list(req.prompt_token_ids)
        self.sampling_params: SamplingParams = req.sampling_params
        self.arrival_time = req.arrival_time
        self.priority = req.priority
        self.eos_token_id = req.eos_token_id
        self.pooling = req.pooling
        self.cache_salt = req.cache_salt
        self.mm_inputs = req.mm_inputs  # images: sent to the runner once, part of the prefix-cache key
        self.lora_request = req.lora_request  # LoRA adapter (None: base model); part of the prefix-cache key
        self.max_tokens = max_tokens  # already clipped to max_model_len - prompt length
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(req.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0  # async scheduling: tokens sampled by steps in flight, not yet known
        self.num_cached_tokens = -1  # prefix-cache hit length of the first schedule; -1 until then
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self.num_preemptions = 0
        self.prompt_logprobs_sent = False
        self.grammar = None  # structured outputs: a core.structured_output.RequestGrammar, set by the engine core

    @property
    def grammar_ready(self) -> bool:
        """False while this request's grammar is still compiling (the scheduler leaves it waiting)."""
        return self.grammar is None or self.grammar.future.done()

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    @property
    def is_finished(self) -> bool:
        return self.status == _FINISHED

    def sort_key(self, policy: str) -> tuple:
        """Queue order: FCFS by arrival; priority by (priority, arrival) — lower value first, as in vLLM."""
        if policy == "priority":
            return (self.priority, self.arrival_time)
        return (self.arrival_time,)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, prompt={self.num_prompt_tokens}, out={self.num_output_tokens}, "
                f"computed={self.num_computed_tokens}, {self.status.name})")
