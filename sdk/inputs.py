"""Prompt types vLLM scripts import (``from vllm.inputs import TokensPrompt``): typed dicts, nothing more.

``LLM.generate``, ``AsyncLLM.generate`` and the engines take them as they take any prompt dict. Keys other
than these are refused naming them (see docs/compatibility.md); ``multi_modal_data`` goes to the multimodal
front end, for models that take images.
"""

from __future__ import annotations

from typing import Any, TypedDict, Union

from typing_extensions import NotRequired


class TextPrompt(TypedDict):
    """A text prompt, tokenized by the engine."""

    prompt: str
    multi_modal_data: NotRequired[dict[str, Any]]
    cache_salt: NotRequired[str]  # extra key of the prefix-cache hashes: only equal salts share cached blocks


class TokensPrompt(TypedDict):
    """A prompt given as token ids (``prompt`` is optional text, used only for the output's ``prompt``)."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    multi_modal_data: NotRequired[dict[str, Any]]
    cache_salt: NotRequired[str]


SingletonPrompt = Union[str, TextPrompt, TokensPrompt]
PromptType = SingletonPrompt

__all__ = ["PromptType", "SingletonPrompt", "TextPrompt", "TokensPrompt"]
