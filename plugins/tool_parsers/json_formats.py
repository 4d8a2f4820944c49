"""Tool-call formats whose calls are JSON objects: hermes, llama3_json, mistral.

Arguments stream as the raw JSON text the model writes (the partial-JSON reader in ``octavo.parsers``
knows where the arguments value starts and whether it is finished), so the streamed fragments concatenate
to exactly the non-streamed ``arguments`` string.
"""

from __future__ import annotations

from octavo.parsers import (
    ToolCallDraft,
    ToolParser,
    call_from_object,
    calls_from_array,
    skip_ws,
    split_content,
)


class HermesToolParser(ToolParser):
    """``<tool_call>{"name": "f", "arguments": {...}}</tool_call>``, one block per call (Hermes, Qwen 2.5);
    also a JSON list of such objects inside one block (SmolLM2's trained format)."""

    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"

    def parse(self, text: str, final: bool) -> tuple[str, list[ToolCallDraft]]:
        content, rest = split_content(text, self.start, final)
        calls: list[ToolCallDraft] = []
        while rest is not None and rest.startswith(self.start):
            i = skip_ws(rest, len(self.start))
            if i >= len(rest):
                break
            if rest[i] == "[":  # SmolLM2 / APIGen: a JSON list of calls inside one block
                drafts, end = calls_from_array(rest, i)
                calls.extend(drafts)
            elif rest[i] == "{":
                draft, end = call_from_object(rest, i)
                calls.append(draft)
            else:
                raise ValueError(f"{self.start} is not followed by a JSON object or list")
            if end is None:
                break
            j = skip_ws(rest, end)
            if rest.startswith(self.end, j):
                j = skip_ws(rest, j + len(self.end))
            rest = rest[j:]
        return content, calls


class Llama3JsonToolParser(ToolParser):
    """Llama 3.1+ JSON tool calls: the reply is ``{"name": "f", "parameters": {...}}`` (optionally after
    ``<|python_tag|>``, several joined by ``;``); a reply that does not start with ``{`` is content."""

    name = "llama3_json"
    tag = "<|python_tag|>"

    def parse(self, text: str, final: bool) -> tuple[str, list[ToolCallDraft]]:
        body = text.lstrip()
        if body.startswith(self.tag):
            body = body[len(self.tag):].lstrip()
        elif not final and self.tag.startswith(body) and body:
            return "", []
        if not body:
            return ("" if not final else text), []
        if body[0] != "{":
            return text, []
        calls, i = [], 0
        while i < len(body) and body[i] == "{":
            draft, end = call_from_object(body, i)
            calls.append(draft)
            if end is None:
                break
            i = skip_ws(body, end)
            if body.startswith(";", i):
                i = skip_ws(body, i + 1)
        return "", calls


class MistralToolParser(ToolParser):
    """``[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]`` (Mistral's special token, then a JSON list)."""

    name = "mistral"
    needs_special_tokens = True
    start = "[TOOL_CALLS]"

    def parse(self, text: str, final: bool) -> tuple[str, list[ToolCallDraft]]:
        content, rest = split_content(text, self.start, final)
        if rest is None:
            return content, []
        i = skip_ws(rest, len(self.start))
        if i >= len(rest):
            return content, []
        if rest[i] == "{":
            draft, _ = call_from_object(rest, i)
            return content, [draft]
        calls, _ = calls_from_array(rest, i)
        return content, calls
