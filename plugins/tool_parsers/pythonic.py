"""Pythonic tool calls (Llama 3.2/4 style): the reply is a Python list of calls, ``[f(a=1), g(b="x")]``.

Parsed with ``ast`` once the list is complete (keyword values must be literals); a reply that does not
start with ``[`` is content. Calls are reported whole, name first, then the JSON arguments.
"""

from __future__ import annotations

import ast
import json

from octavo.parsers import ToolCallDraft, ToolParser


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return f"{_name(func.value)}.{func.attr}"
    raise ValueError("a tool call must name a function")


class PythonicToolParser(ToolParser):
    name = "pythonic"

    def parse(self, text: str, final: bool) -> tuple[str, list[ToolCallDraft]]:
        body = text.strip()
        if body.startswith("<|python_start|>"):
            body = body[len("<|python_start|>"):].removesuffix("<|python_end|>").strip()
        if not body:
            return ("" if not final else text), []
        if body[0] != "[":
            return text, []
        try:
            tree = ast.parse(body, mode="eval").body
        except SyntaxError:
            if final:
                return text, []
            return "", []  # still being written
        if not isinstance(tree, ast.List) or not all(isinstance(e, ast.Call) for e in tree.elts):
            return text, []
        calls = []
        for call in tree.elts:
            if call.args:
                raise ValueError("pythonic tool calls take keyword arguments only")
            args = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
            calls.append(ToolCallDraft(_name(call.func), json.dumps(args, ensure_ascii=False), True))
        return "", calls
