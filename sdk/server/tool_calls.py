"""Tool calling and reasoning output for ``/v1/chat/completions``.

``ToolPlan.from_request`` checks ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` against the server's
flags and decides how the reply is read:

    tool_choice "none"            tools are not shown to the template; the reply is content
    tool_choice "auto"            needs --enable-auto-tool-choice and --tool-call-parser; the parser finds calls
    tool_choice "required"        structured output forces a JSON list of {"name", "parameters"} (each valid
                                  against its function's schema); maxItems 1 without parallel_tool_calls
    tool_choice {function: name}  structured output forces the function's arguments object

``ChoiceReader`` turns one choice's text into the final message, or (streaming) into OpenAI-exact deltas:
``reasoning_content`` first, then ``content``, then per call ``{index, id, type, function: {name,
arguments: ""}}`` followed by argument fragments that concatenate to the non-streamed ``arguments``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from octavo.errors import APIError
from octavo.parsers import ReasoningParser, ToolCallDraft, ToolParser, calls_from_array
from octavo.structured_outputs import StructuredOutputsParams


def _resolve(kind: str, name: str) -> Any:
    from octavo.registry import resolve

    return resolve(kind, name)


def _function(tool: Any, i: int) -> dict:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function" or \
            not isinstance(tool.get("function"), dict) or not tool["function"].get("name"):
        raise APIError(400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': "
                       "{...}}}}", param=f"tools[{i}]")
    return tool["function"]


class ToolPlan:
    """How one chat request's tools are offered and its reply read (see the module docstring)."""

    def __init__(self, mode: str, tools: list[dict] | None, parser: ToolParser | None,
                 reasoning: ReasoningParser | None, constraint: StructuredOutputsParams | None,
                 named: str | None = None, parallel: bool = True) -> None:
        self.mode, self.tools, self.parser, self.reasoning = mode, tools, parser, reasoning
        self.constraint, self.named, self.parallel = constraint, named, parallel

    @property
    def template_tools(self) -> list[dict] | None:
        """The tools the chat template sees (none with tool_choice 'none')."""
        return self.tools if self.mode != "none" else None

    @classmethod
    def from_request(cls, req: Any, settings: Any, tokenizer: Any) -> ToolPlan:
        server = settings.server
        tools = req.tools or None
        choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
        parallel = getattr(req, "parallel_tool_calls", None)
        parallel = True if parallel is None else bool(parallel)
        reasoning = _resolve("reasoning_parsers", server.reasoning_parser)(tokenizer) if server.reasoning_parser \
            else None
        funcs = [_function(t, i) for i, t in enumerate(tools or [])]
        by_name = {f["name"]: f for f in funcs}
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
            if not name:
                raise APIError(400, "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', "
                               "'function': {'name': ...}}", param="tool_choice")
            if name not in by_name:
                raise APIError(400, f"tool_choice names function {name!r}, which is not in tools "
                               f"({sorted(by_name) or 'none given'})", param="tool_choice")
            schema = by_name[name].get("parameters") or {"type": "object", "properties": {}}
            return cls("named", tools, None, reasoning, StructuredOutputsParams(json=schema), name, parallel)
        if choice not in ("none", "auto", "required"):
            raise APIError(400, f"tool_choice {choice!r} is not one of none, auto, required, or a named function",
                           param="tool_choice")
        if choice != "none" and not tools:
            raise APIError(400, f"tool_choice {choice!r} needs tools", param="tool_choice")
        if choice == "required":
            items = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                       "parameters": f.get("parameters") or {"type": "object"}},
                      "required": ["name", "parameters"]} for f in funcs]
            schema = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
            if not parallel:
                schema["maxItems"] = 1
            return cls("required", tools, None, reasoning, StructuredOutputsParams(json=schema), None, parallel)
        parser = None
        if choice == "auto":
            if not (server.enable_auto_tool_choice and server.tool_call_parser):
                raise APIError(400, '"auto" tool choice needs the server started with --enable-auto-tool-choice '
                               "and --tool-call-parser", param="tool_choice")
            parser = _resolve("tool_parsers", server.tool_call_parser)(tokenizer)
        return cls(choice, tools, parser, reasoning, None, None, parallel)

    def reader(self) -> ChoiceReader:
        return ChoiceReader(self)

    @property
    def needs_special_tokens(self) -> bool:
        return bool(self.parser is not None and self.parser.needs_special_tokens)


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ChoiceReader:
    """Reads one choice's growing text (see the module docstring); one per choice and request."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.sent_reasoning = 0
        self.sent_content = 0
        self.sent_calls: list[list] = []  # [id, name, arguments sent so far]

    def _parse(self, final: bool) -> tuple[str | None, str, list[ToolCallDraft]]:
        plan = self.plan
        reasoning, body = (None, self.text) if plan.reasoning is None else plan.reasoning.split(self.text, final)
        if plan.mode == "named":  # the call opens with its arguments: never before (or inside) the reasoning
            return reasoning, "", [ToolCallDraft(plan.named, body.strip(), final)] if body.strip() or final else []
        if plan.mode == "required":
            start = body.find("[")
            if start < 0:
                return reasoning, "", []
            calls, _ = calls_from_array(body, start, ("parameters",))
            return reasoning, "", calls
        if plan.parser is None:
            return reasoning, body, []
        try:
            content, calls = plan.parser.parse(body, final)
        except ValueError:
            return reasoning, body if final else body[:self.sent_content], []
        if not plan.parallel:
            calls = calls[:1]
        return reasoning, content, calls

    def message(self, text: str) -> tuple[dict, bool]:
        """The final assistant message and whether it calls tools."""
        self.text = text
        reasoning, content, calls = self._parse(final=True)
        done = [c for c in calls if c.complete and c.name]
        if calls and (len(done) != len(calls) or not all(_is_json(c.arguments) for c in done)):
            done = []  # a malformed call: return the text as content rather than a call that cannot run
            content = text if reasoning is None else (content or "")
        msg: dict[str, Any] = {"role": "assistant", "content": (content or None) if done else content}
        if self.plan.reasoning is not None:
            msg["reasoning_content"] = reasoning
        if done:
            msg["tool_calls"] = [{"id": _new_id(), "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in done]
        return msg, bool(done)

    def deltas(self, new_text: str, final: bool) -> list[dict]:
        """The deltas to send after ``new_text`` arrived (``final``: the choice just finished)."""
        self.text += new_text
        reasoning, content, calls = self._parse(final)
        out: list[dict] = []
        if reasoning is not None and len(reasoning) > self.sent_reasoning:
            out.append({"reasoning_content": reasoning[self.sent_reasoning:]})
            self.sent_reasoning = len(reasoning)
        if len(content) > self.sent_content:
            out.append({"content": content[self.sent_content:]})
            self.sent_content = len(content)
        for i, call in enumerate(calls):
            if call.name is None:
                break
            if i == len(self.sent_calls):
                self.sent_calls.append([_new_id(), call.name, 0])
                out.append({"tool_calls": [{"index": i, "id": self.sent_calls[i][0], "type": "function",
                                            "function": {"name": call.name, "arguments": ""}}]})
            sent = self.sent_calls[i][2]
            if len(call.arguments) > sent:
                out.append({"tool_calls": [{"index": i, "function": {"arguments": call.arguments[sent:]}}]})
                self.sent_calls[i][2] = len(call.arguments)
        return out

    @property
    def called_tools(self) -> bool:
        return bool(self.sent_calls)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True
