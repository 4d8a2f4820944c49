"""The ``guidance`` structured-output backend, on llguidance: JSON schema, regex, choice, Lark grammars
(a GBNF grammar is converted with ``llguidance.gbnf_to_lark``) and any JSON object. It proves the backend
seam with a second library; choose it with ``--structured-outputs-backend guidance``.
"""

from __future__ import annotations

import json
from typing import Any

from octavo.structured_outputs import (
    GrammarMatcher,
    StructuredOutputBackend,
    StructuredOutputsParams,
    choice_regex,
)


def _grammar_spec(params: StructuredOutputsParams) -> str:
    import llguidance

    kind = params.kind
    defaults = {"whitespace_flexible": not params.disable_any_whitespace}
    if kind == "json":
        schema = params.json if isinstance(params.json, str) else json.dumps(params.json)
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=defaults)
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=defaults)
    if kind in ("regex", "choice"):
        return llguidance.LLMatcher.grammar_from_regex(params.regex if kind == "regex" else choice_regex(params.choice))
    if kind == "grammar":
        from llguidance.gbnf_to_lark import any_to_lark

        return llguidance.LLMatcher.grammar_from_lark(any_to_lark(params.grammar))  # GBNF/EBNF or Lark
    raise ValueError(f"structured_outputs.{kind}: not supported by the guidance backend; use xgrammar")


class _Matcher(GrammarMatcher):
    def __init__(self, matcher: Any) -> None:
        self.m = matcher

    def accept_token(self, token_id: int) -> bool:
        return self.m.consume_token(token_id)

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask(self.m, bitmask, row)

    def is_terminated(self) -> bool:
        return self.m.is_stopped()

    def reset(self) -> None:
        self.m.reset()


class GuidanceBackend(StructuredOutputBackend):
    name = "guidance"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        super().__init__(tokenizer, vocab_size)
        import llguidance.hf

        self.ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)

    @classmethod
    def is_available(cls) -> bool:
        import importlib.util

        return importlib.util.find_spec("llguidance") is not None

    @classmethod
    def validate(cls, params: StructuredOutputsParams) -> None:
        import llguidance

        try:
            spec = _grammar_spec(params)
            ok, msg = llguidance.LLMatcher.validate_grammar(spec), None
            if isinstance(ok, str) and ok:
                msg = ok
            elif isinstance(ok, tuple) and not ok[0]:
                msg = ok[1]
        except Exception as e:  # noqa: BLE001 - llguidance's converters raise plain Exception
            if "not supported by the guidance backend" in str(e):
                raise
            msg = str(e) or type(e).__name__
        if msg:
            raise ValueError(f"structured_outputs.{params.kind}: cannot compile for llguidance: "
                             f"{msg.strip().splitlines()[0]}")

    def compile(self, params: StructuredOutputsParams) -> Any:
        import llguidance

        spec = _grammar_spec(params)
        probe = llguidance.LLMatcher(self.ll_tokenizer, spec)
        if probe.is_error():
            raise ValueError(f"structured_outputs.{params.kind}: {probe.get_error()}")
        return spec

    def matcher(self, compiled: Any) -> GrammarMatcher:
        import llguidance

        return _Matcher(llguidance.LLMatcher(self.ll_tokenizer, compiled))
