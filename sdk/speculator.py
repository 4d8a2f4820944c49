"""The ``Speculator`` interface: proposes draft tokens that the core verifies, and its configuration.

The core verifies every draft exactly (greedy) or by rejection sampling, so a speculator can only change
speed, never the output distribution. Proposers get plain data — each request's token ids so far and how
many drafts are useful — never engine objects. A proposer registers under a method name through
``octavo_register_speculators``; the user picks it with ``speculative_config={"method": ...}``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: vLLM's method names that need the target's hidden states (heads); see docs/spec_decode.md.
HEAD_METHODS = ("eagle", "eagle3", "medusa", "mlp_speculator")


class SpeculativeConfig(BaseModel):
    """``speculative_config`` as vLLM spells it (unknown keys are an error naming them).

    Attributes:
        method: the registered proposer (``ngram``, ``draft_model``, ...). Defaults to ``draft_model`` when
            ``model`` is given.
        num_speculative_tokens: drafts proposed per request and step (k).
        model: the draft model (``draft_model``) or head checkpoint (head methods).
        prompt_lookup_min: shortest n-gram the ``ngram`` proposer matches (default 1).
        prompt_lookup_max: longest n-gram it tries first (default 3).
        draft_tensor_parallel_size: tensor parallelism of the draft model; only 1 runs here.
        disable_by_batch_size: speculation is switched off for a step whose running batch has at least this
            many requests (default 8: verifying k extra tokens per request stops paying once the step is
            compute bound). 0 never switches it off.
        quantization: quantization method of the draft model's weights.
    """

    model_config = ConfigDict(extra="forbid")

    method: str | None = None
    num_speculative_tokens: int = Field(..., ge=1, le=64)
    model: str | None = None
    prompt_lookup_min: int | None = Field(None, ge=1)
    prompt_lookup_max: int | None = Field(None, ge=1)
    draft_tensor_parallel_size: int | None = Field(None, ge=1)
    disable_by_batch_size: int = Field(8, ge=0)
    quantization: str | None = None

    @model_validator(mode="after")
    def _check(self) -> SpeculativeConfig:
        if self.method is None:
            if self.model is None:
                raise ValueError("speculative_config needs 'method' (e.g. \"ngram\") or a draft 'model'")
            self.method = "draft_model"
        if self.method == "ngram":
            if self.model is not None:
                raise ValueError("method 'ngram' looks up n-grams in the prompt and uses no model; drop 'model'")
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            lo = lo if lo is not None else min(1, hi or 1)
            hi = hi if hi is not None else max(3, lo)
            if lo > hi:
                raise ValueError(f"prompt_lookup_min={lo} > prompt_lookup_max={hi}")
            self.prompt_lookup_min, self.prompt_lookup_max = lo, hi
        else:
            for key in ("prompt_lookup_min", "prompt_lookup_max"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} only applies to method 'ngram', not {self.method!r}")
        if self.method in ("draft_model", *HEAD_METHODS) and self.model is None:
            raise ValueError(f"method {self.method!r} needs 'model' (the draft model or head checkpoint)")
        if (self.draft_tensor_parallel_size or 1) != 1:
            raise ValueError(f"draft_tensor_parallel_size={self.draft_tensor_parallel_size}: only 1 is supported "
                             "(the draft runs unsharded in the engine-core process)")
        return self


@dataclass
class SpecRequest:
    """What a proposer sees of one request (plain data).

    Attributes:
        request_id: stable for the request's lifetime (a proposer may keep per-request state by it).
        token_ids: prompt + output tokens so far (all verified).
        num_prompt_tokens: how many of ``token_ids`` are the prompt.
        max_num_drafts: most drafts the engine can use this step (<= num_speculative_tokens; budget,
            ``max_tokens`` and ``max_model_len`` already taken off).
        proposed: for head speculators (:mod:`octavo.spec_heads`), the drafts the worker computed from the
            target's hidden states after the last step; None for proposers that run in the core.
    """

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    max_num_drafts: int
    proposed: list[int] | None = None  # drafts a head speculator already computed on the worker (octavo.spec_heads)


class DraftModel(ABC):
    """A draft model the core loaded for a proposer (its own weights and KV cache), driven with plain data.

    ``run`` feeds each request's ``token_ids`` at positions ``start ..`` (the K/V of positions before
    ``start`` must be the ones this handle computed earlier) and returns the greedy next token of each.
    """

    vocab_size: int

    @abstractmethod
    def run(self, feeds: list[tuple[str, list[int], int]]) -> dict[str, int]:
        """``(request_id, token_ids, start)`` per request -> its argmax next token. A request that does not
        fit the draft's KV cache is left out of the answer."""

    @abstractmethod
    def forget(self, request_ids: list[str]) -> None:
        """Free these requests' draft KV blocks."""


@dataclass
class SpecContext:
    """What the core gives a proposer at start (plain values and one factory, no engine objects).

    Attributes:
        platform: the :class:`octavo.Platform` the target runs on.
        vocab_size: the target model's vocabulary size.
        max_model_len: the target's context length.
        load_draft_model: ``load_draft_model(config) -> DraftModel`` loads ``config.model`` on the same
            platform (raises ``ValueError`` if its vocabulary differs from the target's).
    """

    platform: Any
    vocab_size: int
    max_model_len: int
    load_draft_model: Callable[[SpeculativeConfig], DraftModel] | None = None


class Speculator(ABC):
    """Proposes up to ``num_speculative_tokens`` draft tokens per request each step.

    Proposals must be deterministic functions of what the proposer has seen (the core verifies them as
    one-hot drafts, which keeps sampling exact for any proposal).
    """

    name: ClassVar[str]

    def __init__(self, *, num_speculative_tokens: int, config: SpeculativeConfig | None = None,
                 settings: Any = None, context: SpecContext | None = None) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.config = config
        self.settings = settings
        self.context = context

    @classmethod
    def check(cls, config: SpeculativeConfig, settings: Any, platform: Any, vocab_size: int) -> None:
        """Raise ``ValueError`` (naming the setting) when this method cannot run with this config here.
        Called once at engine start, before any request."""

    @abstractmethod
    def propose(self, requests: list[SpecRequest]) -> list[list[int]]:
        """Each request's draft tokens (possibly none, at most ``max_num_drafts``), in order. Runs on the
        host, in the engine-core process, once per step, for the requests that are decoding."""

    def release(self, request_ids: list[str]) -> None:
        """Forget the per-request state of finished or preempted requests (default: none kept)."""
