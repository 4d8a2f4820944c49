"""``--reasoning-parser deepseek_r1`` through a real ``octavo serve`` and the official ``openai`` client.

The embedded SmolLM2-135M does not reason by itself, but it copies a pattern: the conversation carries three
few-shot turns whose assistant replies are ``<think>\\n...\\n</think>\\nThe answer is N.``, and the chat template
(tests/structured/templates/chatml_think.jinja: ChatML whose generation prompt opens ``<think>``, as
DeepSeek-R1's does) leaves the model inside the reasoning. Greedy, it then writes its own reasoning, closes it
and answers (checked: "3 plus 2 is 5.\\n</think>\\nThe answer is 5."). So the model's real output is split.

Checked: ``reasoning_content`` / ``content`` against the raw text of the same prompt on /v1/completions (no
parser there), streaming deltas (all reasoning before any content) equal to the non-streamed message; with
``response_format`` json_schema the reasoning stays free and the content after ``</think>`` validates (the
grammar starts at the end marker, though the prompt holds earlier turns' ``</think>``); with a named
``tool_choice`` the arguments after the reasoning validate against the function's schema, streamed and not.
"""

from __future__ import annotations

import json
import os

import jinja2
import jsonschema
import openai
import pytest

from octavo.server.launch import ServerProcess

pytestmark = pytest.mark.slow

TEMPLATE = os.path.join(os.path.dirname(__file__), "templates", "chatml_think.jinja")
SHOTS = [("What is 2 plus 3?", "2 plus 3 is 5.", "The answer is 5."),
         ("What is 4 plus 4?", "4 plus 4 is 8.", "The answer is 8."),
         ("What is 1 plus 6?", "1 plus 6 is 7.", "The answer is 7.")]
FEW_SHOT = [m for q, t, a in SHOTS for m in ({"role": "user", "content": q},
                                              {"role": "assistant", "content": f"<think>\n{t}\n</think>\n{a}"})]
ASK = FEW_SHOT + [{"role": "user", "content": "What is 3 plus 2?"}]
ANSWER = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["answer"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}}]
NAMED = {"type": "function", "function": {"name": "add"}}


@pytest.fixture(scope="module")
def client():
    srv = ServerProcess(["--served-model-name", "m", "--max-model-len", "1024", "--kv-cache-memory-bytes", str(64 << 20),
                         "--quantization", "none", "--chat-template", TEMPLATE, "--reasoning-parser", "deepseek_r1",
                         "--uvicorn-log-level", "warning"]).start()
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    assert srv.stop() == 0


def chat(client, **kw):
    kw.setdefault("messages", ASK)
    return client.chat.completions.create(model="m", temperature=0, max_tokens=kw.pop("max_tokens", 40), **kw)


def stream(client, **kw) -> tuple[str, str, list[dict], list[str]]:
    """(reasoning, content, tool-call deltas, the order of delta kinds) of a streamed chat."""
    reasoning, content, calls, order = [], [], [], []
    for chunk in chat(client, stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        r = (d.model_extra or {}).get("reasoning_content")
        if r:
            reasoning.append(r)
            order.append("reasoning")
        if d.content:
            content.append(d.content)
            order.append("content")
        for c in d.tool_calls or []:
            calls.append(c.model_dump(exclude_none=True))
            order.append("tool_calls")
    return "".join(reasoning), "".join(content), calls, order


def test_reasoning_split_matches_raw_text_streamed_and_not(client):
    prompt = jinja2.Template(open(TEMPLATE).read()).render(messages=ASK, add_generation_prompt=True)
    raw = client.completions.create(model="m", prompt=prompt, temperature=0, max_tokens=40).choices[0].text
    assert "</think>" in raw, raw  # the model closed its reasoning by itself
    msg = chat(client).choices[0].message
    reasoning = msg.model_extra["reasoning_content"]
    assert reasoning and "think>" not in reasoning and "think>" not in msg.content
    assert raw == reasoning + "</think>" + raw.split("</think>", 1)[1]
    assert raw.split("</think>", 1)[1].lstrip("\n") == msg.content and msg.content.startswith("The answer")
    s_reasoning, s_content, _, order = stream(client)
    assert (s_reasoning, s_content) == (reasoning, msg.content)
    assert order == sorted(order, key=lambda k: k != "reasoning")  # every reasoning delta before any content


def test_json_schema_applies_after_the_reasoning(client):
    r = chat(client, response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}},
             max_tokens=60)
    msg = r.choices[0].message
    assert msg.model_extra["reasoning_content"].strip(), msg  # free text, not JSON: the grammar waited
    jsonschema.validate(json.loads(msg.content), ANSWER)
    assert r.choices[0].finish_reason == "stop"


def test_named_tool_choice_after_the_reasoning_streamed_and_not(client):
    r = chat(client, tools=TOOLS, tool_choice=NAMED, max_tokens=60)
    msg = r.choices[0].message
    assert msg.model_extra["reasoning_content"].strip()
    (call,) = msg.tool_calls
    assert call.function.name == "add"
    jsonschema.validate(json.loads(call.function.arguments), TOOLS[0]["function"]["parameters"])
    reasoning, content, deltas, order = stream(client, tools=TOOLS, tool_choice=NAMED, max_tokens=60)
    assert reasoning == msg.model_extra["reasoning_content"] and not content
    assert deltas[0]["function"]["name"] == "add" and deltas[0]["id"].startswith("call_")
    assert "".join(d["function"].get("arguments", "") for d in deltas) == call.function.arguments
    assert order == sorted(order, key=lambda k: k != "reasoning")
