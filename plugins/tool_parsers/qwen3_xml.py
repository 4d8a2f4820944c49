"""Qwen3-Coder's XML tool calls::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Parameter values are text; each becomes JSON (a number, bool, object, ... when it parses as JSON, else a
string). A call is reported once its ``</function>`` is seen, name first, then the whole arguments.
"""

from __future__ import annotations

import json
import re

from octavo.parsers import ToolCallDraft, ToolParser, split_content

_FUNC = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.S)
_PARAM = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)


def _value(raw: str):
    raw = raw.strip("\n")
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


class Qwen3XMLToolParser(ToolParser):
    name = "qwen3_xml"
    start = "<tool_call>"

    def parse(self, text: str, final: bool) -> tuple[str, list[ToolCallDraft]]:
        content, rest = split_content(text, self.start, final)
        if rest is None:
            return content, []
        calls = []
        for m in _FUNC.finditer(rest):
            args = {k: _value(v) for k, v in _PARAM.findall(m.group(2))}
            calls.append(ToolCallDraft(m.group(1), json.dumps(args, ensure_ascii=False), True))
        return content, calls
