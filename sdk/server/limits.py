"""Checks on a parsed JSON body before the schema sees it: text the engine can carry, bounded nesting.

JSON may carry what Python strings hold but nothing downstream can: a lone UTF-16 surrogate (``"\\ud800"``)
cannot be encoded to UTF-8 (the tokenizer and the response writer fail on it) and NUL characters are
refused as vLLM does. Deep nesting (a message 300 levels deep) makes templates and validators recurse.
Each failure is a 400 whose ``param`` is the path of the value at fault (``messages[0].content``).
"""

from __future__ import annotations

from typing import Any

from octavo.errors import APIError

MAX_DEPTH = 64  # containers inside containers; a chat body with tool schemas needs well under 20


def check_json_tree(data: Any) -> None:
    """Raise ``APIError(400)`` naming the first bad value (iterative: no recursion on hostile depth)."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
        elif isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                where = path if len(path) <= 80 else path[:80] + "..."
                raise APIError(400, f"{where} is nested more than {MAX_DEPTH} levels deep.", param=where)
            if isinstance(value, dict):
                for key, item in value.items():
                    sub = f"{path}.{key}" if path else str(key)
                    if isinstance(key, str):
                        _check_text(key, sub)
                    stack.append((item, sub, depth + 1))
            else:
                stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


def _check_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise APIError(400, f"{path or 'the body'} contains a NUL character (\\u0000), which is not accepted.",
                       param=path or None)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(400, f"{path or 'the body'} contains a lone UTF-16 surrogate at character {e.start}; "
                       "send valid Unicode text.", param=path or None) from None
