"""Tool-call and reasoning parsers on fixed texts (no model): final parse, and streaming by every split of
the text into deltas gives the same calls, with id + name first and argument fragments that concatenate to
the final ``arguments``."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from octavo.registry import resolve
from octavo.server.tool_calls import ToolPlan

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]

CASES = {
    "hermes": ('Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
               '</tool_call>\n<tool_call>{"name": "add", "arguments": {"a": [1, {"b": "}"}]}}</tool_call>',
               "Let me check."),
    "llama3_json": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
                    '{"name": "add", "parameters": {"a": [1, {"b": "}"}]}}', ""),
    "mistral": ('Sure[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
                '{"name": "add", "arguments": {"a": [1, {"b": "}"}]}}]', "Sure"),
    "qwen3_xml": ('Sure<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n'
                  '<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><tool_call>\n<function=add>\n'
                  '<parameter=a>\n[1, {"b": "}"}]\n</parameter>\n</function>\n</tool_call>', "Sure"),
    "pythonic": ('[get_weather(city="Paris", days=2), add(a=[1, {"b": "}"}])]', ""),
}
EXPECTED = [("get_weather", {"city": "Paris", "days": 2}), ("add", {"a": [1, {"b": "}"}]})]


def plan(parser: str | None = None, reasoning: str | None = None, **req) -> ToolPlan:
    server = SimpleNamespace(enable_auto_tool_choice=parser is not None, tool_call_parser=parser,
                             reasoning_parser=reasoning)
    fields = dict(tools=TOOLS, tool_choice=None, parallel_tool_calls=None)
    fields.update(req)
    return ToolPlan.from_request(SimpleNamespace(**fields), SimpleNamespace(server=server), None)


def stream(p: ToolPlan, text: str, seed: int) -> tuple[str, str, list[tuple[str, str]]]:
    """Feed ``text`` in random pieces; return (reasoning, content, [(name, arguments)]) as a client sees it."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(12, len(text) - 1)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    r, reasoning, content, calls = p.reader(), "", "", {}
    for i, piece in enumerate(pieces):
        for d in r.deltas(piece, final=i == len(pieces) - 1):
            reasoning += d.get("reasoning_content", "")
            content += d.get("content", "")
            for tc in d.get("tool_calls", []):
                if "id" in tc:
                    assert tc["index"] not in calls and tc["function"]["arguments"] == ""
                    assert tc["id"].startswith("call_") and tc["type"] == "function"
                    calls[tc["index"]] = [tc["function"]["name"], ""]
                else:
                    assert set(tc["function"]) == {"arguments"}  # fragments carry no name
                    calls[tc["index"]][1] += tc["function"]["arguments"]
    return reasoning, content, [tuple(calls[i]) for i in sorted(calls)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_tool_parser_final_and_stream_agree(name):
    text, content = CASES[name]
    msg, called = plan(name).reader().message(text)
    assert called and (msg["content"] or "") == content
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]]
    assert got == EXPECTED
    final_args = [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]
    for seed in range(5):
        _, streamed_content, streamed = stream(plan(name), text, seed)
        assert streamed_content == content and streamed == final_args


def test_no_tool_call_is_content_and_parallel_false_keeps_one():
    msg, called = plan("hermes").reader().message("Paris is sunny.")
    assert not called and msg["content"] == "Paris is sunny." and "tool_calls" not in msg
    msg, _ = plan("hermes", parallel_tool_calls=False).reader().message(CASES["hermes"][0])
    assert len(msg["tool_calls"]) == 1


def test_required_and_named_read_the_constrained_text():
    req = plan(None, tool_choice="required")
    assert req.constraint.json["minItems"] == 1
    text = '[{"name": "add", "parameters": {"a": 1}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]'
    msg, called = req.reader().message(text)
    assert called and [c["function"]["name"] for c in msg["tool_calls"]] == ["add", "get_weather"]
    assert stream(plan(None, tool_choice="required"), text, 1)[2] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]
    named = plan(None, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.constraint.json == TOOLS[0]["function"]["parameters"]
    msg, _ = named.reader().message(' {"city": "Oslo"} ')
    assert msg["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}


@pytest.mark.parametrize("req, match", [
    (dict(tool_choice="auto"), "enable-auto-tool-choice"),
    (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "not in tools"),
    (dict(tool_choice="sometimes"), "not one of"),
    (dict(tools=None, tool_choice="required"), "needs tools"),
    (dict(tools=[{"type": "function", "function": {}}]), "tools\\[0\\]"),
])
def test_bad_tool_requests_are_400(req, match):
    from octavo.errors import APIError

    with pytest.raises(APIError, match=match) as e:
        plan(None, **req)
    assert e.value.status == 400


@pytest.mark.parametrize("name, text, want", [
    ("deepseek_r1", "I should add.</think>\n\nThe answer is 4.", ("I should add.", "The answer is 4.")),
    ("deepseek_r1", "<think>I should add.</think>4", ("I should add.", "4")),
    ("deepseek_r1", "still thinking", ("still thinking", "")),
    ("qwen3", "<think>hmm</think>\n\nYes.", ("hmm", "Yes.")),
    ("qwen3", "No reasoning here.", (None, "No reasoning here.")),
])
def test_reasoning_split_final_and_stream(name, text, want):
    parser = resolve("reasoning_parsers", name)()
    assert parser.split(text, final=True) == want
    for seed in range(5):
        reasoning, content, _ = stream(plan(None, reasoning=name, tools=None), text, seed)
        assert (reasoning or None, content) == (want[0] or None, want[1])


def test_reasoning_then_tool_call():
    text = '<think>need weather</think><tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    msg, called = plan("hermes", reasoning="qwen3").reader().message(text)
    assert called and msg["reasoning_content"] == "need weather" and msg["content"] is None
    reasoning, content, calls = stream(plan("hermes", reasoning="qwen3"), text, 3)
    assert reasoning == "need weather" and content == "" and calls[0][0] == "get_weather"
