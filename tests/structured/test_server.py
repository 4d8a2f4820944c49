"""Structured outputs and tool calling through a real ``octavo serve`` (embedded SmolLM2, the shipped
tool-use chat template, ``--enable-auto-tool-choice --tool-call-parser hermes``) and the official client.

response_format json_schema / json_object and ``client.chat.completions.parse(PydanticModel)``; the
completions route with ``structured_outputs`` and the older ``guided_*`` fields; bad grammars are 400s that
name the field; the tool loop (required, named, auto) where streaming and non-streaming give the same calls,
tool results go back as ``tool`` messages after an assistant turn with ``content: null``.
"""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from octavo.chat_templates import path as template_path
from octavo.server.launch import ServerProcess
from tests.structured.schemas import SCHEMAS

pytestmark = pytest.mark.slow

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client():
    # NOTE: no prefix caching: the streamed request repeats the non-streamed one's prompt, and a prefix-cached
    # prompt is computed in other shapes (fp32 rounding), which flipped a greedy near-tie after the first tool
    # call ("]" vs ",": one call vs four until max_tokens) — a comparison of two computations, not of streaming
    srv = ServerProcess(["--served-model-name", "m", "--max-model-len", "1024", "--kv-cache-memory-bytes", str(64 << 20),
                         "--no-enable-prefix-caching", "--chat-template", template_path("smollm2_tool_use"), "--enable-auto-tool-choice",
                         "--tool-call-parser", "hermes", "--uvicorn-log-level", "warning"]).start()
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    assert srv.stop() == 0


def chat(client, **kw):
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 100)
    return client.chat.completions.create(model="m", temperature=0, **kw)


def test_response_format_json_schema_validates(client):
    for name, schema in SCHEMAS.items():
        r = chat(client, messages=[{"role": "user", "content": f"Give an example of {name} as JSON."}],
                 response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
                 max_tokens=300)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)


class City(BaseModel):
    name: str = Field(max_length=12)
    population: int = Field(ge=0, le=50_000_000)
    is_capital: bool


def test_parse_with_pydantic_model(client):
    r = client.chat.completions.parse(model="m", messages=[{"role": "user", "content": "Describe Paris."}],
                                      response_format=City, temperature=0, max_tokens=80)
    assert isinstance(r.choices[0].message.parsed, City)


def test_completions_structured_and_guided_fields(client):
    def complete(**extra):
        r = client.completions.create(model="m", prompt="The answer is", max_tokens=40, temperature=0,
                                      extra_body=extra)
        return r.choices[0].text

    assert complete(guided_choice=["yes", "no"]) in ("yes", "no")
    assert re.fullmatch(r"\d{3}-\d{4}", complete(guided_regex=r"\d{3}-\d{4}"))
    assert re.fullmatch(r"\([0-9]\+[0-9]\)", complete(structured_outputs={"grammar": 'root ::= "(" [0-9] "+" [0-9] ")"'}))
    jsonschema.validate(json.loads(complete(guided_json=SCHEMAS["bounded_numbers"])), SCHEMAS["bounded_numbers"])
    assert isinstance(json.loads(complete(response_format={"type": "json_object"})), dict)


@pytest.mark.parametrize("extra, param", [
    ({"guided_regex": "a(b"}, "guided_regex"),
    ({"structured_outputs": {"grammar": "root ::= nope"}}, "structured_outputs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_regex"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_bad_constraints_are_400(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, extra_body=extra)
    assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body


def stream_calls(client, **kw) -> tuple[list[tuple[str, str]], str | None]:
    """Accumulate streamed tool_calls deltas as a client does: id + name first, then argument fragments."""
    calls: dict[int, list] = {}
    finish = None
    for chunk in chat(client, stream=True, **kw):
        choice = chunk.choices[0]
        for tc in choice.delta.tool_calls or []:
            if tc.id is not None:
                assert tc.index not in calls and tc.function.name and tc.function.arguments == ""
                calls[tc.index] = [tc.function.name, ""]
            else:
                assert tc.function.name is None
                calls[tc.index][1] += tc.function.arguments
        finish = choice.finish_reason or finish
    return [tuple(calls[i]) for i in sorted(calls)], finish


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_calls_stream_equals_non_stream(client, tool_choice):
    # NOTE: one call (parallel_tool_calls=False: the "required" list gets maxItems 1): since the CPU int8-activation
    # default (796330f) the greedy SmolLM2 keeps appending calls to the list until max_tokens
    kw = dict(tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=False)
    r = chat(client, **kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None and msg.tool_calls
    for call in msg.tool_calls:
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), TOOLS[0]["function"]["parameters"])
    streamed, finish = stream_calls(client, **kw)
    assert finish == "tool_calls"
    assert streamed == [(c.function.name, c.function.arguments) for c in msg.tool_calls]


def test_auto_tool_loop_with_shipped_template(client):
    # SmolLM2-135M rarely decides to call a tool on its own; a regex over the template's call format makes it,
    # and the hermes parser then has to find the call in the text (stream and not).
    call = r'<tool_call>\[\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,9}", "unit": "celsius"\}\}\]</tool_call>'
    r = chat(client, tools=TOOLS, tool_choice="auto", extra_body={"guided_regex": call})
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and len(msg.tool_calls) == 1
    args = json.loads(msg.tool_calls[0].function.arguments)
    assert args["unit"] == "celsius"
    streamed, _ = stream_calls(client, tools=TOOLS, tool_choice="auto", extra_body={"guided_regex": call})
    assert streamed == [("get_weather", msg.tool_calls[0].function.arguments)]
    # the next turn: assistant tool_calls with content null, then the tool's result, rendered by the template
    follow = ASK + [{"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in msg.tool_calls]},
                    {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": '{"temp_c": 21}'}]
    final = chat(client, messages=follow, tools=TOOLS, max_tokens=20)
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # without a constraint the model answers in text: content, no tool_calls
    plain = chat(client, tools=TOOLS, max_tokens=20)
    assert plain.choices[0].message.content and not plain.choices[0].message.tool_calls
    none = chat(client, tools=TOOLS, tool_choice="none", max_tokens=5)
    assert none.choices[0].message.tool_calls is None
