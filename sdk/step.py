"""The step contract: everything that crosses the executor boundary, as plain msgspec data.

Public (``octavo.step``) because executors are plugins: an executor plugin moves these structs between
the engine core and its workers (as msgpack bytes across processes or hosts) without importing the core.

    EngineCore ──StepBatch──▶ Executor ──▶ Worker(s) ──▶ ModelRunner
               ◀─RunnerOutput─          (rank 0's answer)
    Worker ──WorkerInfo (once, at start)──▶ EngineCore

Nothing live crosses: no ``Request``, no tensor, no scheduler object. So one engine core drives an
in-process worker, N worker processes (the batch goes out as msgpack) or Ray actors the same way. The
runner keeps its own per-request state (prompt, tokens so far, sampling parameters, seeded generator)
across steps: a request is described in full once (:class:`NewRequestData`, the first step that schedules it
after the runner last forgot it); later steps carry only what changes (:class:`ScheduledRequestData`); and
``finished_ids`` tells the runner what to forget, before it runs the step.

Extending it (speculative tokens, grammars, adapters): add a field with a default to the struct that owns
the lifetime -- per request and fixed (an adapter name, a grammar spec): ``NewRequestData``; per request and
per step (draft token ids to verify, a bitmask): ``ScheduledRequestData``; per request result:
``RunnerOutput`` (``sampled`` already holds a list per request, so a verified draft returns several tokens).
Defaults keep old senders valid; ``omit_defaults`` keeps the wire small.
"""

from __future__ import annotations

import msgspec

from octavo.lora.request import LoRARequest
from octavo.sampling_params import SamplingParams

# A token id the engine core does not know yet (async scheduling): in ``ScheduledRequestData.token_ids`` it
# stands for the token the previous step sampled for that request, which the runner takes from the device.
PLACEHOLDER = -1


class TokenLogprobs(msgspec.Struct, array_like=True):
    """Top log-probabilities at one position: parallel lists, the chosen token first."""

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]


class MultiModalInput(msgspec.Struct, array_like=True, omit_defaults=True):
    """One image (or other item) of a request, already processed by the front end: the model's input
    tensor as raw bytes (``dtype``/``shape``), the content hash (encoder-cache and prefix-cache key) and the
    placeholder span ``[offset, offset + length)`` in the prompt its embeddings replace."""

    modality: str
    hash: str
    offset: int
    length: int
    data: bytes
    dtype: str
    shape: list[int]
    # (t, h, w) patch grid of a dynamic-resolution item (Qwen2-VL): its vision tower and M-RoPE positions need it
    grid_thw: list[int] = []


class NewRequestData(msgspec.Struct, array_like=True, omit_defaults=True):
    """What the runner keeps about a request for its whole life (sent once; again only after it forgot it)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None = None
    pooling: bool = False  # an embedding request: the pooled vector comes back instead of a token
    lora_request: LoRARequest | None = None  # the LoRA adapter it runs with (None: the base model)
    mm_inputs: list[MultiModalInput] = []  # images etc. (octavo.core.multimodal), in prompt order


class ScheduledRequestData(msgspec.Struct, array_like=True, omit_defaults=True):
    """One request's work this step: run ``token_ids`` at positions ``[num_computed_tokens, + len)``.

    ``token_ids`` are the request's tokens at those positions (the prompt chunk while prefilling, the last
    sampled token while decoding, prompt + outputs again after a preemption); the runner writes them into its
    copy of the sequence, so it never has to guess what the scheduler accepted. ``block_ids`` is the full
    block table (not a delta: a sliding window releases old blocks in place, which a delta would miss).
    """

    request_id: str
    token_ids: list[int]
    num_computed_tokens: int  # tokens whose K/V are already in the cache
    block_ids: list[int]
    samples: bool = False  # this step reaches the end of the known tokens: sample (or pool) one more
    spec_token_ids: list[int] = []  # draft tokens run after token_ids and verified (speculative decoding)
    # structured outputs: packed int32 bitmask of the tokens allowed next (filled by the engine core)
    grammar_bitmask: bytes | None = None


class StepBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    """One engine step for the runner(s). ``scheduled`` lists decode-only requests first
    (``num_decode_reqs`` of them), then prefills and chunks."""

    scheduled: list[ScheduledRequestData] = []
    new_requests: list[NewRequestData] = []  # described before they appear in ``scheduled``
    finished_ids: list[str] = []  # forget these (finished, aborted) before running this step
    num_decode_reqs: int = 0
    total_num_tokens: int = 0
    # head speculators (Medusa, MLP speculator) run on the worker: drafts to propose after this step for each
    # request that samples (0: none; the engine core's policy switches them off at large batches)
    num_spec_proposals: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class PromptLogprobs(msgspec.Struct, array_like=True):
    """Prompt logprobs computed this step for one request: ``entries[j]`` is for prompt position
    ``first_pos + j`` (a chunked prefill sends its chunk's positions)."""

    first_pos: int
    entries: list[TokenLogprobs]


class RunnerOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """What a step produced, keyed by request id (only requests that produced something appear)."""

    sampled: dict[str, list[int]] = {}  # new token ids (one today; several once drafts are verified)
    logprobs: dict[str, list[TokenLogprobs]] = {}  # one entry per sampled token, when asked for
    prompt_logprobs: dict[str, PromptLogprobs] = {}
    pooled: dict[str, list[float]] = {}
    failed: dict[str, str] = {}  # requests the runner could not serve (e.g. a bad LoRA adapter) -> the error
    mm_items_encoded: int = 0  # images run through the vision encoder this step
    mm_encoder_cache_hits: int = 0  # images this step needed that the encoder cache already held
    spec_token_ids: dict[str, list[int]] = {}  # drafts a head speculator proposed on the worker, for next step


class WorkerInfo(msgspec.Struct, omit_defaults=True):
    """What a worker tells the engine core once, after loading the model and sizing the KV cache.

    The engine core builds its KV manager, scheduler and :class:`~octavo.core.messages.ModelInfo` from this
    alone. With several ranks, every rank must agree on the cache geometry; the executor takes the minimum
    ``num_blocks`` over ranks (each rank holds its own shard of every block).
    """

    num_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
    architecture: str
    model_source: str
    dtype: str
    device: str
    sliding_window: int | None = None  # shared by every paged layer, else None
    is_pooling: bool = False
    embedding_dim: int | None = None
    pooler: dict = {}  # a pooling model's ``pooler_info`` (task, defaults; octavo.pooling)
    eos_token_ids: list[int] = []
    tokenizer_path: str | None = None
    attention_backend: str | None = None
    quantization: str | None = None  # the quantizer the weights were loaded with (None: dense)
    world_size: int = 1  # tensor x pipeline ranks behind this executor
