"""vLLM's output classes for pooling models: ``PoolingRequestOutput`` and its typed views.

Names and fields follow ``vllm.outputs``: ``PoolingOutput.data`` (a torch tensor in ``LLM`` results),
``ClassificationOutput.probs`` / ``num_classes``, ``ScoringOutput.score``, ``EmbeddingOutput.embedding`` /
``hidden_size``, each wrapped as ``<Kind>RequestOutput(request_id, outputs, prompt_token_ids, finished)``
with ``from_base(PoolingRequestOutput)``. The server's routes use the same objects with ``data`` a list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:  # vLLM's name for the vector's length
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """The embedding of one input (``LLM.embed``)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True


__all__ = ["PoolingOutput", "PoolingRequestOutput", "ClassificationOutput", "ClassificationRequestOutput",
           "ScoringOutput", "ScoringRequestOutput", "EmbeddingOutput", "EmbeddingRequestOutput"]

T = TypeVar("T")


def _values(data: Any) -> list:
    return data.tolist() if hasattr(data, "tolist") else list(data)


@dataclass
class PoolingOutput:
    """The pooled output of one input: ``data`` is the vector (``[dim]`` or ``[num_labels]``)."""

    data: Any


@dataclass
class PoolingRequestOutput(Generic[T]):
    """One pooling request's result (``LLM.encode``/``reward``; the base of the typed outputs)."""

    request_id: str
    outputs: T
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass
class ClassificationOutput:
    """Class probabilities (or raw logits with ``use_activation=False``) of one input."""

    probs: list[float]

    @staticmethod
    def from_base(output: PoolingOutput) -> ClassificationOutput:
        return ClassificationOutput(_values(output.data))

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    """The relevance score of one (text_1, text_2) pair."""

    score: float

    @staticmethod
    def from_base(output: PoolingOutput) -> ScoringOutput:
        values = _values(output.data)
        if len(values) != 1:
            raise ValueError(f"a score is one number; the model gave {len(values)} values")
        return ScoringOutput(float(values[0]))


@dataclass
class ClassificationRequestOutput(PoolingRequestOutput[ClassificationOutput]):
    @staticmethod
    def from_base(request_output: PoolingRequestOutput) -> ClassificationRequestOutput:
        return ClassificationRequestOutput(request_output.request_id,
                                           ClassificationOutput.from_base(request_output.outputs),
                                           request_output.prompt_token_ids, request_output.finished)


@dataclass
class ScoringRequestOutput(PoolingRequestOutput[ScoringOutput]):
    @staticmethod
    def from_base(request_output: PoolingRequestOutput) -> ScoringRequestOutput:
        return ScoringRequestOutput(request_output.request_id, ScoringOutput.from_base(request_output.outputs),
                                    request_output.prompt_token_ids, request_output.finished)
