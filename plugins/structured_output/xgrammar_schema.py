"""Rewrite short bounded JSON strings into the equivalent ``pattern`` before xgrammar compiles a schema.

Why: xgrammar 0.2.8 turns ``{"type": "string", "maxLength": N}`` into a rule repetition
``chars{min, N}``, and for N up to ~128 filling the next-token mask inside such a string costs 10-40 ms
per request (a scan of the whole vocabulary: the cached masks do not hold near the bound), against
0.02-0.15 ms for the same string written as ``{"type": "string", "pattern": "^[\\s\\S]{min,N}$"}``,
which xgrammar compiles into one JSON-string regex. Measured on the embedded SmolLM2 tokenizer
(49152 tokens); at batch 32 in a list of short strings it made the step's fill 300 ms of CPU work.
Above N = 128 the costs swap (the regex gets slow, the repetition fast), so longer bounds stay as they are.

The two forms accept the same JSON text: no escape sequences (xgrammar's ``maxLength`` form does not allow
them either), at most N (at least ``minLength``) characters counted as code points. The regex form also
refuses raw control characters (e.g. a raw tab), which are not valid inside a JSON string anyway; the
``maxLength`` form lets them through. tests/structured/test_fill_fast.py checks the masks token by token.
"""

from __future__ import annotations

from typing import Any

MAX_REWRITTEN_LENGTH = 128  # measured: at 192 the regex form is the slow one (docs/structured_outputs.md)
_DATA_KEYS = frozenset(("enum", "const", "default", "examples"))  # values here are data, not schemas
_OTHER_STRING_KEYS = frozenset(("pattern", "format", "enum", "const", "contentEncoding", "contentMediaType"))


def _bounded_string(node: dict) -> tuple[int, int] | None:
    """``(minLength, maxLength)`` if ``node`` is a plain string schema whose bounds the regex can carry."""
    if node.get("type") not in ("string", ["string"]) or "maxLength" not in node:
        return None
    if _OTHER_STRING_KEYS & node.keys():
        return None
    lo, hi = node.get("minLength", 0), node["maxLength"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)):
        return None
    if not 0 <= lo <= hi <= MAX_REWRITTEN_LENGTH:
        return None  # an invalid pair keeps xgrammar's own error message
    return lo, hi


def bounded_strings_as_patterns(node: Any) -> Any:
    """A copy of the schema ``node`` with every short bounded string schema as its ``pattern`` form;
    everything else (including ``enum``/``const``/``default``/``examples`` data) unchanged."""
    if isinstance(node, list):
        return [bounded_strings_as_patterns(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: (v if k in _DATA_KEYS else bounded_strings_as_patterns(v)) for k, v in node.items()}
    bounds = _bounded_string(out)
    if bounds is not None:
        out.pop("minLength", None)
        out.pop("maxLength")
        out["pattern"] = f"^[\\s\\S]{{{bounds[0]},{bounds[1]}}}$"
    return out
