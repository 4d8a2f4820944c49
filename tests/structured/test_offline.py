"""Structured outputs through ``LLM`` on the embedded SmolLM2: every output parses and validates against its
JSON schema, matches its regex / choice / grammar; n > 1, stop strings and preemption (a KV cache too small
for the batch) keep the constraint; a bad grammar is a ValueError naming the field."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from octavo import LLM, SamplingParams
from octavo.structured_outputs import GuidedDecodingParams, StructuredOutputsParams
from tests.structured.schemas import SCHEMAS

PROMPT = "Describe a person as JSON:"


@pytest.fixture(scope="module")
def llm():
    # 20 blocks of 16 tokens: the 12-sequence batch below cannot fit, so sequences are preempted and resumed
    engine = LLM(max_model_len=256, max_num_seqs=12, num_gpu_blocks_override=20, kv_admission="greedy")
    yield engine
    engine.llm_engine.shutdown()


def gen(llm, so, n=1, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 120)
    params = SamplingParams(n=n, structured_outputs=so, **kw)
    return [c for out in llm.generate([PROMPT], params, use_tqdm=False) for c in out.outputs]


def test_json_schemas_validate_with_n_and_preemption(llm):
    prompts, params, schemas = [], [], []
    for seed, (name, schema) in enumerate(SCHEMAS.items()):
        for temperature in (0.0, 0.8):
            prompts.append(f"Give an example of {name.replace('_', ' ')} as JSON:")
            params.append(SamplingParams(n=2 if temperature else 1, temperature=temperature, seed=seed,
                                         max_tokens=120, structured_outputs=StructuredOutputsParams(json=schema)))
            schemas.append(schema)
    before = llm.llm_engine.get_stats().num_preemptions
    outs = llm.generate(prompts, params, use_tqdm=False)
    for out, schema in zip(outs, schemas):
        for c in out.outputs:
            assert c.finish_reason == "stop", c.text
            jsonschema.validate(json.loads(c.text), schema)
    assert llm.llm_engine.get_stats().num_preemptions > before  # the constraint survived preemption


def test_regex_choice_grammar_json_object(llm):
    (c,) = gen(llm, StructuredOutputsParams(regex=r"[A-Z][a-z]{2,8} \d{2}"))
    assert re.fullmatch(r"[A-Z][a-z]{2,8} \d{2}", c.text)
    for c in gen(llm, GuidedDecodingParams(choice=["yes", "no", "maybe"]), n=3, temperature=1.0, seed=3):
        assert c.text in ("yes", "no", "maybe")
    grammar = 'root ::= "(" expr ")"\nexpr ::= num (("+" | "*") num)*\nnum ::= [1-9] [0-9]?'
    (c,) = gen(llm, StructuredOutputsParams(grammar=grammar), max_tokens=40)
    assert re.fullmatch(r"\([1-9][0-9]?([+*][1-9][0-9]?)*\)", c.text), c.text
    eval(c.text)  # noqa: S307 - the grammar only allows digits, + and *
    (c,) = llm.generate(['Repeat this JSON exactly: {"ok": true}\nJSON:'], SamplingParams(
        temperature=0, max_tokens=60, structured_outputs=StructuredOutputsParams(json_object=True)),
        use_tqdm=False)[0].outputs
    assert c.finish_reason == "stop" and isinstance(json.loads(c.text), dict), c.text


def test_stop_string_inside_constrained_output(llm):
    (c,) = gen(llm, StructuredOutputsParams(regex=r"(ab){10}"), stop=["abab"])
    assert c.text == "" and c.finish_reason == "stop"
    (c,) = gen(llm, StructuredOutputsParams(regex=r"(ab){10}"), stop=["abab"], include_stop_str_in_output=True)
    assert c.text == "abab"


def test_unconstrained_neighbours_are_untouched(llm):
    free = SamplingParams(temperature=0, max_tokens=12)
    alone = llm.generate([PROMPT], free, use_tqdm=False)[0].outputs[0].text
    mixed = llm.generate([PROMPT, PROMPT], [free, SamplingParams(temperature=0, max_tokens=12, structured_outputs=
                                                                StructuredOutputsParams(choice=["x"]))],
                         use_tqdm=False)
    assert mixed[0].outputs[0].text == alone and mixed[1].outputs[0].text == "x"


@pytest.mark.parametrize("so, field", [
    (dict(regex="a(b"), "structured_outputs.regex"),
    (dict(grammar="root ::= undefined_rule"), "structured_outputs.grammar"),
    (dict(json={"type": "nonsense"}), "structured_outputs.json"),
])
def test_bad_grammar_is_a_value_error_naming_the_field(llm, so, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        gen(llm, StructuredOutputsParams(**so))
    assert not llm.llm_engine.has_unfinished_requests()


def test_exactly_one_constraint():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json={"type": "object"}, regex="a")
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
