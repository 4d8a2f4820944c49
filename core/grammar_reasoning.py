"""Where a request's grammar starts when a reasoning parser is on (issue 11 item 6): structured output applies
after the reasoning ends, i.e. right after the end marker (``</think>``) in the output, unless the prompt already
closed the reasoning (then from the first output token). Used by core/structured_output.py when it builds a
request's matcher.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def find_after(seq: list[int], sub: list[int], start: int = 0) -> int:
    """Index just after the first occurrence of ``sub`` in ``seq[start:]``, or -1."""
    n = len(sub)
    for i in range(max(start, 0), len(seq) - n + 1):
        if seq[i:i + n] == sub:
            return i + n
    return -1


def grammar_start(req: Any, g: Any, end_ids: list[int], markers: tuple[str, str],
                  decode: Callable[[list[int]], str]) -> int | None:
    """The index in ``req.output_token_ids`` where the grammar ``g`` (a RequestGrammar) begins, or None while the
    reasoning is still open. The prompt closed the reasoning only if its last end marker follows its last start
    marker (earlier turns' reasoning in a multi-turn prompt, or a template that opens <think>, do not); decided
    once, on the text: "<think>" tokenizes differently after a space."""
    if g.prompt_open is None:
        text = decode(req.prompt_token_ids)
        g.prompt_open = text.rfind(markers[1]) <= text.rfind(markers[0])
    if not g.prompt_open:
        return 0
    pos = find_after(req.output_token_ids, end_ids)
    return None if pos < 0 else pos
