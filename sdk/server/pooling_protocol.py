"""Request bodies of the pooling routes (``/pooling``, ``/classify``, ``/score``, ``/rerank``), with vLLM's names.

Each body keeps unknown fields so they can be judged like the generation routes' (``vllm_fields``): vLLM's
fields that would change the result and octavo lacks are refused (400 naming them) unless sent with their
no-op value; anything else is warned about once per name. ``pooling_params()`` turns a body's declared
pooling fields into a ``PoolingParams``; the front end then honors or refuses each (``PoolingParams.verify``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, model_validator

from octavo.pooling_params import PoolingParams
from octavo.server.pooling_common import input_prompts, refuse_fields
from octavo.server.protocol import I32, U32, _Checked

# vLLM request fields octavo does not implement on these routes -> their no-op values
_REFUSED: dict[str, tuple] = {"embed_dtype": (None, "float32"), "messages": (None,), "mm_processor_kwargs": (None, {}),
                              "max_tokens_per_doc": (None,), "rank_fields": (None,), "chat_template": (None,)}


class _PoolingBody(_Checked):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    truncate_prompt_tokens: I32 | None = None
    use_activation: bool | None = None
    softmax: bool | None = None  # deprecated alias of use_activation (vLLM)
    activation: bool | None = None  # deprecated alias of use_activation (vLLM)
    add_special_tokens: bool = True
    priority: I32 = 0
    user: str | None = None
    request_id: str | None = None

    @model_validator(mode="after")
    def _extra_fields(self) -> _PoolingBody:
        from octavo.server.vllm_fields import check_extra_fields

        refuse_fields(self.model_extra or {}, _REFUSED, "on this route")
        check_extra_fields(self)
        return self

    def pooling_params(self, task: str) -> PoolingParams:
        return PoolingParams(truncate_prompt_tokens=self.truncate_prompt_tokens, task=task,
                             use_activation=self.use_activation, softmax=self.softmax, activation=self.activation,
                             **self._embed_fields())

    def _embed_fields(self) -> dict[str, Any]:
        return {}


class _InputBody(_PoolingBody):
    input: str | list[str] | list[I32] | list[list[I32]]

    def prompts(self) -> list[Any]:
        """``input`` -> one prompt per item (a string, or ``{"prompt_token_ids": ...}``)."""
        return input_prompts(self.input)


class PoolingRequest(_InputBody):
    """``POST /pooling``: the model's pooled output per input (its default task, or ``task``)."""

    task: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: U32 | None = None
    normalize: bool | None = None

    def _embed_fields(self) -> dict[str, Any]:
        return {"dimensions": self.dimensions, "normalize": self.normalize}


class ClassificationRequest(_InputBody):
    """``POST /classify``: class probabilities per input."""


class ScoreRequest(_PoolingBody):
    """``POST /score`` and ``/v1/score``: relevance of (text_1, text_2) pairs (1:N or N:N)."""

    text_1: str | list[str]
    text_2: str | list[str]


class RerankRequest(_PoolingBody):
    """``POST /rerank``, ``/v1/rerank`` (Jina) and ``/v2/rerank`` (Cohere): documents ordered by relevance."""

    query: str
    documents: list[str | dict[str, str]]
    top_n: U32 | None = None  # None or 0: all documents
    return_documents: bool = True

    def document_texts(self) -> list[str]:
        out = []
        for i, doc in enumerate(self.documents):
            if isinstance(doc, dict):
                if set(doc) != {"text"}:
                    raise ValueError(f"documents[{i}] must be a string or {{\"text\": ...}}")
                doc = doc["text"]
            out.append(doc)
        if not out:
            raise ValueError("'documents' is empty")
        return out
