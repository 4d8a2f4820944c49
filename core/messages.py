"""Messages between the front end (LLM, AsyncLLM, server) and the engine core, as msgspec structs.

They cross the process boundary as msgpack (no pickle on the wire); in-process they are passed as is.
Token ids travel, never text: tokenization and detokenization stay in the front end.
"""

from __future__ import annotations

import enum

import msgspec

from octavo.lora.request import LoRARequest
from octavo.sampling_params import SamplingParams
from octavo.step import MultiModalInput, TokenLogprobs  # defined with the step contract


class FinishReason(enum.IntEnum):
    STOP = 0  # EOS, a stop token id, or (decided by the front end) a stop string
    LENGTH = 1  # max_tokens or max_model_len reached
    ABORT = 2  # aborted by the caller or the front end
    ERROR = 3  # the engine failed this request

    def __str__(self) -> str:
        return ("stop", "length", "abort", "error")[self.value]


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    """One sequence to run. A request with ``n > 1`` is fanned out by the front end into ``n`` of these
    (ids ``"{parent}-{i}"``) sharing the prompt, so prefix caching reuses its KV blocks."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    priority: int = 0
    eos_token_id: int | None = None
    pooling: bool = False  # an embedding request: one forward pass, the pooled vector comes back
    cache_salt: str | None = None  # extra key for prefix-cache hashing (e.g. adapter or tenant)
    lora_request: LoRARequest | None = None  # the adapter this sequence runs with (None: the base model)
    mm_inputs: list[MultiModalInput] = []  # processed images (octavo.core.multimodal), in prompt order


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """What one step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # once, on the step that finishes the prompt
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    pooled: list[float] | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SchedulerStats(msgspec.Struct):
    """Engine state after a step, exported as metrics by the server."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0  # fraction of blocks in use (0..1)
    prefix_cache_queries: int = 0  # tokens looked up in the prefix cache, cumulative
    prefix_cache_hits: int = 0  # tokens found, cumulative
    num_preemptions: int = 0  # cumulative
    num_prompt_tokens: int = 0  # computed prompt tokens, cumulative
    num_generation_tokens: int = 0  # cumulative
    num_steps: int = 0
    # speculative decoding, cumulative (see docs/spec_decode.md); a list is replaced, never mutated
    spec_decode_num_drafts: int = 0  # verification rounds: request-steps that carried drafts
    spec_decode_num_draft_tokens: int = 0  # drafts proposed (and verified)
    spec_decode_num_accepted_tokens: int = 0  # drafts accepted
    spec_decode_num_emitted_tokens: int = 0  # tokens those rounds emitted (accepted + 1 each, unless stopped)
    spec_decode_accepted_per_pos: list[int] = []  # [j]: rounds whose draft j was accepted
    mm_items_encoded: int = 0  # images run through a vision encoder, cumulative (docs/multimodal.md)
    mm_encoder_cache_hits: int = 0  # image encodings served from the encoder cache, cumulative

    @property
    def spec_decode_acceptance_rate(self) -> float:
        n = self.spec_decode_num_draft_tokens
        return self.spec_decode_num_accepted_tokens / n if n else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True):
    outputs: list[EngineCoreOutput]
    stats: SchedulerStats | None = None
    timestamp: float = 0.0


class ModelInfo(msgspec.Struct):
    """What the front end needs to know about the loaded model (sent once, at start)."""

    model: str  # the path or id that was loaded
    served_model_name: str
    architecture: str
    vocab_size: int
    max_model_len: int
    eos_token_id: int | None
    eos_token_ids: list[int] = []  # every end-of-sequence id (e.g. Llama 3: <|end_of_text|>, <|eot_id|>)
    is_pooling: bool = False
    embedding_dim: int | None = None
    pooler: dict = {}  # a pooling model's ``pooler_info``: its task and defaults (octavo.pooling)
    tokenizer_path: str | None = None  # where the front end loads the same tokenizer from
    num_kv_blocks: int = 0
    block_size: int = 16
    dtype: str = ""
    device: str = ""
    platform: str = ""  # the selected platform plugin (the dashboard's startup summary shows these three)
    attention_backend: str = ""
    quantization: str = ""  # the quantizer's name, "" for none
