"""A JSON schema's grammar with its whitespace capped by one regex rule, not xgrammar's rule repetition.

Used by the xgrammar backend for ``json`` / ``json_object`` with free whitespace (``WHITESPACE_AS_REGEX``).

Why: octavo caps the free whitespace in each gap of a JSON value at 16 characters (small models otherwise
loop on newlines until ``max_tokens``). xgrammar 0.2.8's own cap (``max_whitespace_cnt``) compiles every
gap to a rule repetition ``ws{0, 16}``, and masks near a repetition are rebuilt at fill time (the same
cost that made ``maxLength`` strings slow, see xgrammar_schema.py): in random-token walks through the
benchmark schema a row's fill was 3-5x dearer with the cap than without. The same language written as
one regex rule ``ws_cap ::= Regex("[ \\n\\r\\t]{0,16}")`` (a 17-state automaton) filled the same walks in
0.73x the time; 16 nested optional rules 0.89x; 16 optional characters in a row 30x slower (ambiguous).

How: xgrammar builds the uncapped grammar (every gap is ``[ \\n\\r\\t]*``), we print it as EBNF, replace each
such gap outside string literals, character classes and ``Regex("...")`` arguments by one rule ``ws_cap``
and parse it back. If the printed form ever changes so that nothing matches, the caller falls back to
xgrammar's own cap (same language, slower). tests/structured/test_whitespace_cap.py compares the masks with
xgrammar's ``max_whitespace_cnt`` form at every token of texts with whitespace runs up to and past the cap.
"""

from __future__ import annotations

from typing import Any

_GAP = "[ \\n\\r\\t]*"  # as xgrammar 0.2.8 prints the unbounded whitespace of a JSON gap
_RULE = "ws_cap"


def replace_gaps(ebnf: str) -> tuple[str, int]:
    """``ebnf`` with every top-level ``[ \\n\\r\\t]*`` replaced by the rule name; and how many were replaced.
    String literals (``"..."``, which also covers ``Regex("...")`` arguments) and character classes are
    copied as they are."""
    out, i, n, count = [], 0, len(ebnf), 0
    while i < n:
        c = ebnf[i]
        if c == "[" and ebnf.startswith(_GAP, i):
            out.append(_RULE)
            i += len(_GAP)
            count += 1
            continue
        if c in "\"[":
            close = '"' if c == '"' else "]"
            j = i + 1
            while j < n and ebnf[j] != close:
                j += 2 if ebnf[j] == "\\" else 1
            out.append(ebnf[i:j + 1])
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out), count


def _cap_rules(cap: int, form: str) -> str:
    """The ``ws_cap`` rule: ``regex`` (what the backend uses), or the ``nested`` / ``chain`` forms measured
    against it (benchmarks/structured_fill.py; docs/structured_outputs.md "Whitespace between JSON tokens")."""
    ch = "[ \\n\\r\\t]"
    if form == "regex":
        return f'{_RULE} ::= Regex("{ch}{{0,{cap}}}")\n'
    if form == "nested":
        lines = [f"{_RULE} ::= \"\" | {ch} {_RULE}_1\n"]
        for k in range(1, cap - 1):
            lines.append(f"{_RULE}_{k} ::= \"\" | {ch} {_RULE}_{k + 1}\n")
        lines.append(f"{_RULE}_{cap - 1} ::= \"\" | {ch}\n")
        return "".join(lines)
    return f"{_RULE} ::= " + " ".join([f"{ch}?"] * cap) + "\n"


def capped_whitespace_grammar(xgr: Any, schema: str, cap: int, form: str = "regex") -> str | None:
    """EBNF of ``schema`` (JSON text) with at most ``cap`` whitespace characters per gap, or None when the
    printed grammar has no gap to replace (then use xgrammar's ``max_whitespace_cnt``)."""
    ebnf, count = replace_gaps(str(xgr.Grammar.from_json_schema(schema, any_whitespace=True)))
    if count == 0 or f"{_RULE} ::=" in ebnf:
        return None
    return ebnf + _cap_rules(cap, form)
