"""Structured outputs: what a request asks its output to match, and the interface grammar backends implement.

``StructuredOutputsParams`` is vLLM's spelling (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``,
``structural_tag``; exactly one). It is a msgspec struct so it rides inside ``SamplingParams`` across the
engine-core process boundary. ``StructuredOutputBackend`` is the plugin interface (kind
``structured_output_backends``, hook ``octavo_register_structured_output_backends``): the front end calls
``validate`` (no tokenizer, cheap, turns a bad grammar into a ``ValueError`` -> HTTP 400 naming the field),
the engine core builds one backend per engine with the tokenizer and calls ``compile`` off the step loop,
then drives one ``GrammarMatcher`` per request.

Token bitmasks are packed ``int32`` tensors ``[rows, ceil(vocab / 32)]``: bit ``t % 32`` of word ``t // 32``
set means token ``t`` is allowed. xgrammar and llguidance both use this layout.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import msgspec

#: the fields of which exactly one must be set, in vLLM's order
GRAMMAR_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class StructuredOutputsParams(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Constrain a request's output (vLLM-compatible; give exactly one of the six).

    Attributes:
        json: a JSON schema (dict or JSON string); the output is one JSON value valid against it.
        regex: a regular expression the whole output matches.
        choice: the output is exactly one of these strings.
        grammar: a context-free grammar (EBNF/GBNF for xgrammar, Lark for llguidance).
        json_object: any JSON object (``response_format={"type": "json_object"}``).
        structural_tag: an xgrammar structural tag (JSON string): free text in which each ``begin`` tag
            is followed by a JSON value matching its schema and the ``end`` tag.
        disable_any_whitespace: JSON without free whitespace between tokens (helps small models).
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        given = [f for f in GRAMMAR_FIELDS if getattr(self, f) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs: give exactly one of " + ", ".join(GRAMMAR_FIELDS)
                             + (f"; got {given}" if given else "; got none"))
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError("structured_outputs.choice: must be a non-empty list of non-empty strings")
        if isinstance(self.json, str):
            try:
                json.loads(self.json)
            except json.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json: not valid JSON ({e})") from None

    @property
    def kind(self) -> str:
        """Which of the six is set."""
        return next(f for f in GRAMMAR_FIELDS if getattr(self, f) not in (None, False))

    def key(self) -> tuple[str, str]:
        """A hashable ``(kind, spec)`` pair; compiled grammars are cached under it."""
        kind = self.kind
        value = getattr(self, kind)
        if kind == "json":
            spec = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        elif kind == "choice":
            spec = json.dumps(value)
        elif kind == "json_object":
            spec = ""
        else:
            spec = value
        if self.disable_any_whitespace:
            kind += ":compact"
        return kind, spec


#: vLLM's older name, kept so code written against it runs.
GuidedDecodingParams = StructuredOutputsParams


def choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of ``choices`` (how backends without a choice primitive express it)."""
    import re

    return "(" + "|".join(re.escape(c) for c in choices) + ")"


class GrammarMatcher:
    """Per-request matcher state. Advanced with each accepted token; fills its row of the step's bitmask."""

    def accept_token(self, token_id: int) -> bool:
        """Advance by one generated token; False if the grammar forbids it (the engine then ends the request)."""
        raise NotImplementedError

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (a host int32 tensor)."""
        raise NotImplementedError

    def is_terminated(self) -> bool:
        """True once the grammar accepted end-of-sequence: the output is complete."""
        raise NotImplementedError

    def reset(self) -> None:
        """Back to the start state (a preempted request replays its output through ``accept_token``)."""
        raise NotImplementedError


class StructuredOutputBackend:
    """A grammar library behind one interface. Subclasses set ``name`` and implement the methods.

    Built once per engine core, in the engine-core process, with the front end's tokenizer (a Hugging Face
    tokenizer) and the model's vocabulary size (the logits width, which may exceed the tokenizer's).
    """

    name: ClassVar[str] = ""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size

    @classmethod
    def is_available(cls) -> bool:
        """Whether the library imports here (cheap)."""
        return True

    @classmethod
    def validate(cls, params: StructuredOutputsParams) -> None:
        """Check a request's grammar without a tokenizer; raise ``ValueError`` naming the field if it cannot
        compile or uses something this backend does not support. Runs in the front end."""

    def compile(self, params: StructuredOutputsParams) -> Any:
        """Compile to a tokenizer-specific grammar (slow; runs on the engine core's compile thread, cached)."""
        raise NotImplementedError

    def matcher(self, compiled: Any) -> GrammarMatcher:
        """A fresh matcher over a compiled grammar (cheap)."""
        raise NotImplementedError

    def fill_bitmasks(self, matchers: list[GrammarMatcher], bitmask: Any) -> None:
        """Fill ``bitmask[i]`` from ``matchers[i]`` for every i (one call per step; runs on a host thread while
        the model runs, so a library that releases the GIL overlaps the forward). Override for a batched or
        multi-threaded fill."""
        for i, m in enumerate(matchers):
            m.fill_bitmask(bitmask, i)

    def accept_tokens(self, matchers: list[GrammarMatcher], tokens: list[int]) -> list[bool]:
        """Advance ``matchers[i]`` by ``tokens[i]`` for every i (one call per step, on the bitmask thread);
        whether each was allowed. Override for a batched call."""
        return [m.accept_token(t) for m, t in zip(matchers, tokens)]

    def allocate_bitmask(self, rows: int) -> Any:
        """A host ``int32`` tensor ``[rows, ceil(vocab_size / 32)]``."""
        import torch

        return torch.full((rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)


__all__ = ["StructuredOutputsParams", "GuidedDecodingParams", "StructuredOutputBackend", "GrammarMatcher",
           "GRAMMAR_FIELDS", "choice_regex"]
