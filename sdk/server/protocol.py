"""Request bodies of the OpenAI-compatible API (pydantic), and their translation to ``SamplingParams``.

OpenAI's fields plus vLLM's extras (top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
skip_special_tokens, include_stop_str_in_output, return_token_ids, prompt_logprobs, stop_token_ids,
allowed_token_ids, priority, ...), so vLLM's clients and benchmark tools work unchanged. Undeclared fields
that would change the output are refused, others accepted with a one-time warning (``vllm_fields``).
Responses are plain dicts built in ``octavo.server.openai``; their shape is OpenAI's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from octavo.sampling_params import RequestOutputKind, SamplingParams
from octavo.server.limits import check_json_tree

# Every integer a client sends is bounded here, so nothing overflows further down (msgpack, torch seeds).
I32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
U32 = Annotated[int, Field(ge=0, le=2**31 - 1)]
I64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


class _Checked(BaseModel):
    """Base of every request body: no NaN/inf floats; text without NUL or lone surrogates; bounded nesting."""

    model_config = ConfigDict(allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _check_tree(cls, data: Any) -> Any:
        check_json_tree(data)  # raises APIError(400, param=<the field's path>)
        return data


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Checked):
    """Fields shared by chat and completions."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    best_of: int | None = Field(None, ge=1, le=128)
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    seed: I64 | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM extras
    top_k: I32 | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: U32 = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stop_token_ids: list[I32] | None = None
    allowed_token_ids: list[I32] | None = None
    prompt_logprobs: U32 | None = None
    return_token_ids: bool = False
    priority: I32 = 0
    request_id: str | None = None
    truncate_prompt_tokens: I32 | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)

    @model_validator(mode="after")
    def _vllm_fields(self) -> _Sampling:
        from octavo.server.vllm_fields import check_extra_fields

        check_extra_fields(self)  # extras that would change the output: 400 naming them; others: warned once
        if self.stream and self.prompt_logprobs is not None:
            from octavo.errors import APIError

            raise APIError(400, "prompt_logprobs is not available with stream=true (as in vLLM).",
                           param="prompt_logprobs")
        opts = self.stream_options
        if opts is not None and not self.stream:
            from octavo.errors import APIError

            raise APIError(400, "stream_options needs stream=true (as in vLLM).", param="stream_options")
        if opts is not None and opts.continuous_usage_stats and not opts.include_usage:
            from octavo.errors import APIError

            raise APIError(400, "stream_options.continuous_usage_stats needs include_usage=true.",
                           param="stream_options.continuous_usage_stats")
        return self

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, val in (v or {}).items():
            if not key.lstrip("-").isdigit() or len(key) > 11:
                raise ValueError(f"logit_bias keys must be token ids (as strings), got {key[:20]!r}")
            if not -100 <= val <= 100:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {val} for token {key}")
        return v

    def _params(self, *, max_tokens: int | None, logprobs: int | None, stream: bool) -> SamplingParams:
        """Build ``SamplingParams``; raises ``ValueError`` (-> 400) naming the bad field."""
        p: dict[str, Any] = dict(
            n=self.n, best_of=self.best_of, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, seed=self.seed, max_tokens=max_tokens,
            min_tokens=self.min_tokens, stop=self.stop, stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos, logprobs=logprobs, prompt_logprobs=self.prompt_logprobs,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            allowed_token_ids=self.allowed_token_ids, truncate_prompt_tokens=self.truncate_prompt_tokens,
            logit_bias={int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        )
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
            value = getattr(self, name)
            if value is not None:
                p[name] = value
        if self.best_of is None:
            p.pop("best_of")
        return SamplingParams(**p)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[I32] | list[list[I32]]
    max_tokens: I32 | None = 16
    logprobs: int | None = Field(None, ge=0, le=2**31 - 1)
    echo: bool = False
    suffix: str | None = None
    add_special_tokens: bool = True

    def prompts(self) -> list[Any]:
        """The prompt(s) as a list: each a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("prompt must not be empty")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)

    def to_sampling_params(self) -> SamplingParams:
        if self.suffix:
            raise ValueError("suffix is not supported; drop it")
        return self._params(max_tokens=self.max_tokens, logprobs=self.logprobs, stream=self.stream)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]] = Field(..., min_length=1)
    max_tokens: I32 | None = None
    max_completion_tokens: I32 | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    # vLLM extras
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _check_messages(cls, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, m in enumerate(msgs):
            if "role" not in m:
                raise ValueError(f"messages[{i}] has no 'role'")
            if not isinstance(m["role"], str) or not m["role"].strip():  # custom roles go to the template (vLLM)
                raise ValueError(f"messages[{i}].role must be a non-empty string")
            content = m.get("content")
            if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image_url"
                                                 for p in content):
                continue  # images: kept for the serving layer (a model that takes no images: 400 there)
            if isinstance(content, list):  # content parts: only text can be rendered by a text model
                texts = []
                for part in content:
                    if not isinstance(part, dict) or part.get("type") != "text":
                        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                        raise ValueError(f"messages[{i}].content part of type {kind!r} is not supported; "
                                         "this model takes text only")
                    texts.append(str(part.get("text", "")))
                m["content"] = "".join(texts)
            elif content is not None and not isinstance(content, str):
                raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
        return msgs

    def to_sampling_params(self) -> SamplingParams:
        # response_format, tools and tool_choice are read by octavo.server.structured / tool_calls
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._params(max_tokens=max_tokens, logprobs=logprobs, stream=self.stream)


class TokenizeRequest(_Checked):
    """``POST /tokenize`` (vLLM): a prompt, or chat messages rendered with the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Checked):
    """``POST /detokenize`` (vLLM)."""

    model: str | None = None
    tokens: list[I32]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo


ErrorType = Literal["invalid_request_error", "authentication_error", "not_found_error",
                    "service_unavailable_error", "internal_error"]
