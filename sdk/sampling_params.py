"""``SamplingParams``: how to pick each next token and when to stop, with vLLM's names and meanings.

A msgspec struct, so it crosses the engine-core process boundary without pickle. Every check runs at
construction: bad values raise ``ValueError`` naming the field, before the request reaches the engine.
"""

from __future__ import annotations

import copy
from enum import IntEnum

import msgspec

from octavo.structured_outputs import StructuredOutputsParams

_SAMPLING_EPS = 1e-5


class RequestOutputKind(IntEnum):
    CUMULATIVE = 0  # every output carries everything so far (vLLM's default)
    DELTA = 1  # every output carries only what is new since the last one (streaming)
    FINAL_ONLY = 2  # one output, when the request finishes


class SamplingParams(msgspec.Struct, omit_defaults=True, kw_only=True, dict=True):
    """Sampling parameters of one request (vLLM-compatible).

    Attributes:
        n: number of independent completions for the prompt.
        temperature: 0 means greedy; higher flattens the distribution.
        top_p: keep the smallest set of tokens whose probability sums to at least top_p (0 < top_p <= 1).
        top_k: keep the k most likely tokens; -1 (or 0) keeps all.
        min_p: drop tokens whose probability is below min_p times the top token's.
        presence_penalty: subtracted from the logit of every token already generated (-2..2).
        frequency_penalty: subtracted once per occurrence in the output so far (-2..2).
        repetition_penalty: >1 discourages tokens seen in the prompt or output (divides positive logits,
            multiplies negative ones), as in Hugging Face.
        seed: per-request seed; the output then depends only on it, not on the rest of the batch.
        max_tokens: most tokens to generate (None: up to max_model_len).
        min_tokens: EOS and stop_token_ids are suppressed until this many tokens were generated.
        stop: strings that end the output (matched across token boundaries, excluded from the text
            unless include_stop_str_in_output).
        stop_token_ids: token ids that end the output (the token is kept in token_ids).
        ignore_eos: keep generating after EOS.
        logprobs: number of top log-probabilities to return per generated token (the sampled token is
            always included); None returns none. Values are of the raw model distribution.
        prompt_logprobs: the same for each prompt token.
        logit_bias: token id -> value added to its logit.
        allowed_token_ids: if given, only these tokens can be sampled.
        bad_words: accepted for compatibility; not supported yet (an error if non-empty).
        include_stop_str_in_output: keep the matched stop string in the text.
        skip_special_tokens: drop special tokens from the text.
        spaces_between_special_tokens: only True (fast tokenizers join special tokens without spaces; False
            with skip_special_tokens=False is refused).
        detokenize: produce text at all (False returns token ids only).
        output_kind: cumulative, delta or final-only outputs.
        structured_outputs: constrain the output to a JSON schema, regex, choice or grammar
            (``StructuredOutputsParams``); ``guided_decoding`` is vLLM's older name for the same field.
        truncate_prompt_tokens: keep only the last k prompt tokens (-1: the last max_model_len - 1).
    """

    n: int = 1
    best_of: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None
    guided_decoding: StructuredOutputsParams | None = None
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.guided_decoding is not None:
            if self.structured_outputs is not None:
                raise ValueError("SamplingParams.guided_decoding: give structured_outputs or guided_decoding, not both")
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        if self.logit_bias:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if self.top_k == 0:
            self.top_k = -1
        self._verify()
        if self.temperature < _SAMPLING_EPS:
            # Greedy: the filters below cannot change the argmax, so drop them (as vLLM does).
            self.temperature = 0.0
            self.top_p, self.top_k, self.min_p = 1.0, -1, 0.0

    def _verify(self) -> None:
        def bad(field: str, why: str) -> None:
            raise ValueError(f"SamplingParams.{field}: {why}")

        if not isinstance(self.n, int) or self.n < 1:
            bad("n", f"must be an integer >= 1, got {self.n!r}")
        if self.best_of is not None and self.best_of != self.n:
            bad("best_of", "is not supported unless equal to n; drop it")
        if self.temperature < 0:
            bad("temperature", f"must be >= 0 (0 means greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            bad("top_k", f"must be -1 (disabled) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", f"must be in [0, 1], got {self.min_p}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad("presence_penalty", f"must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad("frequency_penalty", f"must be in [-2, 2], got {self.frequency_penalty}")
        if self.repetition_penalty <= 0:
            bad("repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        if self.max_tokens is not None and self.max_tokens < 1:
            bad("max_tokens", f"must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            bad("min_tokens", f"must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.logprobs is not None and self.logprobs < 0:
            bad("logprobs", f"must be >= 0, got {self.logprobs}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            bad("prompt_logprobs", f"must be >= 0, got {self.prompt_logprobs}")
        if any(not s for s in self.stop):
            bad("stop", "must not contain empty strings")
        if self.allowed_token_ids is not None and len(self.allowed_token_ids) == 0:
            bad("allowed_token_ids", "must not be empty when given")
        if self.truncate_prompt_tokens is not None and (not isinstance(self.truncate_prompt_tokens, int)
                                                         or self.truncate_prompt_tokens < -1
                                                         or self.truncate_prompt_tokens == 0):
            bad("truncate_prompt_tokens", f"must be -1 (max_model_len) or >= 1, got {self.truncate_prompt_tokens!r}")
        if not self.spaces_between_special_tokens and not self.skip_special_tokens:
            bad("spaces_between_special_tokens", "False is not supported: fast tokenizers (all octavo loads) join "
                "special tokens without spaces either way, as vLLM's fast detokenizer does")
        if self.bad_words:
            bad("bad_words", "is not supported yet; use logit_bias with -100 on those tokens")
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", f"must be an integer, got {self.seed!r}")

    def clone(self) -> SamplingParams:
        return copy.deepcopy(self)

    def __repr__(self) -> str:
        fields = {f: getattr(self, f) for f in self.__struct_fields__}
        return "SamplingParams(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


from octavo.beam_search import BeamSearchParams  # noqa: E402,F401  (vLLM: vllm.sampling_params.BeamSearchParams)
