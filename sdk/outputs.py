"""What a request returns, with vLLM's class and field names so offline scripts carry over unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Logprob:
    """Log-probability of one token under the raw model distribution, its rank (1 = most likely) and text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One entry per position: {token_id: Logprob}; the chosen token is always among the keys.
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    """One of the ``n`` completions of a request."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request: its prompt and its completions so far (or their new parts, in delta mode)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    num_cached_tokens: int = 0


# vLLM scripts import the embedding and pooling output classes from ``vllm.outputs``: the same names here,
# defined in ``octavo.pooling_outputs`` (which imports nothing from this module).
from octavo.pooling_outputs import (  # noqa: E402,F401
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
