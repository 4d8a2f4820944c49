"""Output parsers of the OpenAI server: tool calls and reasoning, as plugin interfaces, plus a partial-JSON
reader they share.

Both parse the *whole text generated so far* each time (``final=False`` while streaming, ``True`` at the
end) and must be monotone: what they report may grow but never change, so the server can stream the
difference (content deltas, tool-call names, then argument fragments). Kinds ``tool_parsers`` and
``reasoning_parsers`` (hooks ``octavo_register_tool_parsers`` / ``octavo_register_reasoning_parsers``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass
class ToolCallDraft:
    """One tool call as far as the text shows it.

    Attributes:
        name: the function name, once complete (None before).
        arguments: the arguments' JSON text generated so far; grows by appending only.
        complete: the call (its arguments included) is finished.
    """

    name: str | None
    arguments: str = ""
    complete: bool = False


class ToolParser:
    """Turns generated text into ``(content, tool calls)``. Subclasses set ``name`` and implement ``parse``.

    Args:
        tokenizer: the model's tokenizer (some formats use special tokens).
    """

    name: ClassVar[str] = ""
    #: keep special tokens in the text, for formats whose markers are special tokens (``[TOOL_CALLS]``)
    needs_special_tokens: ClassVar[bool] = False

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def parse(self, text: str, final: bool) -> tuple[str, list[ToolCallDraft]]:
        """Content to show (only text that can no longer turn out to be a tool call) and the calls so far."""
        raise NotImplementedError


class ReasoningParser:
    """Splits ``<think>...</think>`` reasoning from the answer. Subclasses set the markers.

    ``end_token`` also tells the engine core when reasoning is over, so structured output starts there.
    """

    name: ClassVar[str] = ""
    start_token: ClassVar[str] = "<think>"
    end_token: ClassVar[str] = "</think>"
    #: True when the chat template already opened the reasoning (the output may lack the start token)
    starts_in_reasoning: ClassVar[bool] = False

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def split(self, text: str, final: bool) -> tuple[str | None, str]:
        """``(reasoning or None, content)`` of the text so far; each only grows as text is added."""
        start, end = self.start_token, self.end_token
        body = text
        stripped = text.lstrip()
        if stripped.startswith(start):
            body = stripped[len(start):]
        elif not final and start.startswith(stripped):  # could still become "<think>"
            return None, ""
        elif not self.starts_in_reasoning:
            return None, text
        if end in body:
            reasoning, _, content = body.partition(end)
            return reasoning, content.lstrip("\n") if content.strip() or final else ""
        return body if final else hold_back(body, end), ""


def hold_back(text: str, marker: str) -> str:
    """``text`` without a trailing piece that could be the start of ``marker`` (not safe to stream yet)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return text[:-k]
    return text


def split_content(text: str, marker: str, final: bool) -> tuple[str, str | None]:
    """``(content before marker, rest from marker)``; without the marker, content holds back a partial one."""
    idx = text.find(marker)
    if idx >= 0:
        return text[:idx], text[idx:]
    return (text if final else hold_back(text, marker)), None


# ----------------------------------------------------------------------------------------- partial JSON
_WS = " \t\r\n"
_PRIMITIVE = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?|true|false|null")


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def value_end(text: str, i: int) -> int | None:
    """End index of the JSON value starting at ``text[i]``; None if the text ends before it does."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        j = i + 1
        while j < len(text):
            if text[j] == "\\":
                j += 2
                continue
            if text[j] == '"':
                return j + 1
            j += 1
        return None
    if c in "{[":
        depth, j, in_str = 0, i, False
        while j < len(text):
            ch = text[j]
            if in_str:
                if ch == "\\":
                    j += 1
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    m = _PRIMITIVE.match(text, i)
    if m is None:
        raise ValueError(f"not JSON at {text[i:i + 20]!r}")
    return m.end() if m.end() < len(text) else None  # a number at the very end may still grow


def object_members(text: str, i: int) -> tuple[dict[str, tuple[int, int | None]], int | None]:
    """Top-level members of the JSON object at ``text[i]`` (``{``): key -> (value start, value end or None),
    and the object's end index (None while incomplete). Keys only appear once complete."""
    members: dict[str, tuple[int, int | None]] = {}
    i += 1
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            return members, None
        if text[i] == "}":
            return members, i + 1
        if text[i] == ",":
            i += 1
            continue
        kend = value_end(text, i)
        if text[i] != '"':
            raise ValueError(f"expected a key at {text[i:i + 20]!r}")
        if kend is None:
            return members, None
        key = json.loads(text[i:kend])
        i = skip_ws(text, kend)
        if i >= len(text):
            return members, None
        if text[i] != ":":
            raise ValueError(f"expected ':' at {text[i:i + 20]!r}")
        i = skip_ws(text, i + 1)
        if i >= len(text):
            return members, None
        end = value_end(text, i)
        members[key] = (i, end)
        if end is None:
            return members, None
        i = end


def call_from_object(text: str, i: int, args_keys: tuple[str, ...] = ("arguments", "parameters")
                     ) -> tuple[ToolCallDraft, int | None]:
    """A ``{"name": ..., "arguments": {...}}`` object at ``text[i]`` as a draft, and its end index."""
    members, end = object_members(text, i)
    draft = ToolCallDraft(None)
    if "name" in members and members["name"][1] is not None:
        s, e = members["name"]
        draft.name = json.loads(text[s:e])
    for key in args_keys:
        if key in members:
            s, e = members[key]
            draft.arguments = text[s:e] if e is not None else text[s:]
            break
    draft.complete = end is not None
    if draft.complete and not draft.arguments:
        draft.arguments = "{}"
    return draft, end


def calls_from_array(text: str, i: int, args_keys: tuple[str, ...] = ("arguments", "parameters")
                     ) -> tuple[list[ToolCallDraft], int | None]:
    """Every call object of the JSON array at ``text[i]`` (``[``), and the array's end index."""
    calls = []
    i += 1
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            return calls, None
        if text[i] == "]":
            return calls, i + 1
        if text[i] == ",":
            i += 1
            continue
        draft, end = call_from_object(text, i, args_keys)
        calls.append(draft)
        if end is None:
            return calls, None
        i = end


__all__ = ["ToolParser", "ReasoningParser", "ToolCallDraft", "hold_back", "split_content", "value_end",
           "object_members", "call_from_object", "calls_from_array", "skip_ws"]
