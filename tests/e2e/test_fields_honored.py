"""The rule of issue 16: every field of every public request type is honored or refused naming it.

The test enumerates ``SamplingParams``' fields, each server request schema's fields and the engine settings,
and fails when one has no check here. Each check proves the field changes behaviour (two runs that differ
only in the field give different results) or is refused with an error naming it. One offline ``LLM`` on the
embedded SmolLM2 (the server's schemas: test_fields_honored_server.py); outputs are a few tokens.
The table of the same fields is docs/compatibility.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from octavo import SamplingParams
from octavo.inputs import TokensPrompt
from octavo.sampling_params import RequestOutputKind
from octavo.structured_outputs import StructuredOutputsParams

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
REPEAT = "one two one two one two one two one two one two"
G = dict(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    from octavo import LLM, EngineArgs

    return LLM.from_engine_args(EngineArgs(max_model_len=256, kv_cache_memory_bytes=32 << 20))


def run(llm, prompt=PROMPT, **kw):
    return llm.generate([prompt], SamplingParams(**{**G, **kw}), use_tqdm=False)[0]


def ids(llm, prompt=PROMPT, **kw) -> list[int]:
    return list(run(llm, prompt, **kw).outputs[0].token_ids)


def refused(field: str, fn, *args, **kw) -> None:
    with pytest.raises((ValueError, TypeError)) as e:
        fn(*args, **kw)
    assert field in str(e.value), f"the error should name {field!r}: {e.value}"


# ------------------------------------------------------------------------------------ SamplingParams
def _n(llm):
    out = run(llm, n=3, temperature=1.0, seed=1)
    assert len(out.outputs) == 3


def _best_of(llm):
    refused("best_of", SamplingParams, n=1, best_of=2)
    assert len(run(llm, n=2, best_of=2, temperature=1.0, seed=1).outputs) == 2


def _temperature(llm):
    assert ids(llm) != ids(llm, temperature=5.0, seed=3)


def _top_p(llm):
    greedy = ids(llm)
    assert ids(llm, temperature=3.0, seed=3) != greedy
    assert ids(llm, temperature=3.0, seed=3, top_p=1e-4) == greedy


def _top_k(llm):
    greedy = ids(llm)
    assert ids(llm, temperature=3.0, seed=3) != greedy
    assert ids(llm, temperature=3.0, seed=3, top_k=1) == greedy


def _min_p(llm):
    greedy = ids(llm)
    assert ids(llm, temperature=3.0, seed=3, min_p=1.0) == greedy


def _penalty(name, value):
    def check(llm):
        assert ids(llm, REPEAT, max_tokens=12) != ids(llm, REPEAT, max_tokens=12, **{name: value})
    return check


def _seed(llm):
    a, b = ids(llm, temperature=1.0, seed=7), ids(llm, temperature=1.0, seed=7)
    assert a == b and a != ids(llm, temperature=1.0, seed=8)


def _max_tokens(llm):
    assert len(ids(llm, max_tokens=3)) == 3


def _min_tokens(llm):
    first = ids(llm)[0]
    assert len(ids(llm, ignore_eos=False, stop_token_ids=[first])) == 1
    assert len(ids(llm, ignore_eos=False, stop_token_ids=[first], min_tokens=4)) >= 4


def _stop(llm):
    text = run(llm).outputs[0].text
    word = text.split()[1]
    cut = run(llm, stop=[word]).outputs[0]
    assert word not in cut.text and cut.finish_reason == "stop" and cut.stop_reason == word


def _include_stop_str_in_output(llm):
    word = run(llm).outputs[0].text.split()[1]
    assert run(llm, stop=[word], include_stop_str_in_output=True).outputs[0].text.endswith(word)


def _stop_token_ids(llm):
    greedy = ids(llm)
    assert ids(llm, ignore_eos=False, stop_token_ids=[greedy[1]]) == greedy[:2]


def _ignore_eos(llm):
    eos = llm.get_tokenizer().eos_token_id
    assert ids(llm, ignore_eos=False, logit_bias={eos: 100}) == [eos]
    assert len(ids(llm, logit_bias={eos: 100})) == G["max_tokens"]


def _logprobs(llm):
    assert run(llm).outputs[0].logprobs is None
    lps = run(llm, logprobs=2).outputs[0].logprobs
    assert len(lps) == G["max_tokens"] and all(len(p) >= 2 for p in lps)


def _prompt_logprobs(llm):
    assert run(llm).prompt_logprobs is None
    out = run(llm, prompt_logprobs=1)
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids) and out.prompt_logprobs[0] is None
    assert all(p for p in out.prompt_logprobs[1:])


def _logit_bias(llm):
    assert ids(llm, logit_bias={42: 100.0})[0] == 42


def _allowed_token_ids(llm):
    assert set(ids(llm, allowed_token_ids=[42, 43])) <= {42, 43}


def _bad_words(llm):
    refused("bad_words", SamplingParams, bad_words=["Paris"])


def _skip_special_tokens(llm):
    special = 1  # <|im_start|>
    keep = run(llm, logit_bias={special: 100}, skip_special_tokens=False).outputs[0].text
    drop = run(llm, logit_bias={special: 100}).outputs[0].text
    assert "<|im_start|>" in keep and "<|im_start|>" not in drop


def _spaces_between_special_tokens(llm):
    refused("spaces_between_special_tokens", SamplingParams, skip_special_tokens=False,
            spaces_between_special_tokens=False)


def _detokenize(llm):
    out = run(llm, detokenize=False).outputs[0]
    assert out.text == "" and len(out.token_ids) == G["max_tokens"]


def _output_kind(llm):
    engine = llm.llm_engine
    engine.add_request("delta", PROMPT, SamplingParams(**G, output_kind=RequestOutputKind.DELTA))
    sizes = []
    while engine.has_unfinished_requests():
        sizes += [len(o.outputs[0].token_ids) for o in engine.step()]
    assert sizes and max(sizes) == 1 and sum(sizes) == G["max_tokens"]  # DELTA: only what is new each time


def _structured(name):
    def check(llm):
        so = StructuredOutputsParams(choice=["yes", "no"])
        assert run(llm, max_tokens=4, ignore_eos=False, **{name: so}).outputs[0].text in ("yes", "no")
    return check


def _truncate_prompt_tokens(llm):
    out = run(llm, {"prompt_token_ids": list(range(100, 140))}, truncate_prompt_tokens=8)
    assert out.prompt_token_ids == list(range(132, 140))
    refused("truncate_prompt_tokens", SamplingParams, truncate_prompt_tokens=0)


SAMPLING_CHECKS = {
    "n": _n, "best_of": _best_of, "temperature": _temperature, "top_p": _top_p, "top_k": _top_k, "min_p": _min_p,
    "presence_penalty": _penalty("presence_penalty", 2.0), "frequency_penalty": _penalty("frequency_penalty", 2.0),
    "repetition_penalty": _penalty("repetition_penalty", 3.0), "seed": _seed, "max_tokens": _max_tokens,
    "min_tokens": _min_tokens, "stop": _stop, "stop_token_ids": _stop_token_ids, "ignore_eos": _ignore_eos,
    "logprobs": _logprobs, "prompt_logprobs": _prompt_logprobs, "logit_bias": _logit_bias,
    "allowed_token_ids": _allowed_token_ids, "bad_words": _bad_words,
    "include_stop_str_in_output": _include_stop_str_in_output, "skip_special_tokens": _skip_special_tokens,
    "spaces_between_special_tokens": _spaces_between_special_tokens, "detokenize": _detokenize,
    "output_kind": _output_kind, "structured_outputs": _structured("structured_outputs"),
    "guided_decoding": _structured("guided_decoding"), "truncate_prompt_tokens": _truncate_prompt_tokens,
}


def test_every_sampling_field_has_a_check():
    assert set(SamplingParams.__struct_fields__) == set(SAMPLING_CHECKS)


@pytest.mark.parametrize("field", sorted(SAMPLING_CHECKS))
def test_sampling_field(llm, field):
    SAMPLING_CHECKS[field](llm)


def test_unknown_sampling_field_is_refused():
    refused("use_beam_search", SamplingParams, use_beam_search=True)


# ------------------------------------------------------------------------------------ prompts and requests
def test_prompt_dict_keys(llm):
    refused("mm_processor_kwargs", llm.generate, [{"prompt": "hi", "mm_processor_kwargs": {"x": 1}}],
            use_tqdm=False)
    toks = TokensPrompt(prompt_token_ids=list(range(200, 240)))  # 40 tokens: two full blocks of 16
    a = run(llm, {**toks, "cache_salt": "tenant-a"}, max_tokens=1)
    same = run(llm, {**toks, "cache_salt": "tenant-a"}, max_tokens=1)
    other = run(llm, {**toks, "cache_salt": "tenant-b"}, max_tokens=1)
    assert same.num_cached_tokens >= 32 and other.num_cached_tokens == 0, (a.num_cached_tokens,
                                                                          same.num_cached_tokens,
                                                                          other.num_cached_tokens)


def test_priority_needs_the_priority_policy(llm):
    refused("priority", llm.generate, [PROMPT], SamplingParams(**G), use_tqdm=False, priority=[1])


# ------------------------------------------------------------------------------------ engine settings
# Statically here (each is read by engine code outside config.py); by behaviour, one engine per value, in
# tests/e2e/test_settings_honored.py.
READ_AS = {"model": "settings.model.model", "device": "device.device"}
REPO = Path(__file__).resolve().parents[2]
# A permission, not a behaviour: octavo never runs a model's remote code, so allowing it changes nothing; a
# model that needs remote code fails to load naming its architecture either way (docs/compatibility.md).
PERMISSIONS = {"trust_remote_code"}


def _code() -> str:
    defs = ("config.py", "config_sections.py", "config_sources.py")  # where settings are defined, not read
    files = [p for d in ("sdk", "core", "plugins") for p in (REPO / d).rglob("*.py") if p.name not in defs]
    return "\n".join(p.read_text() for p in files)


def test_every_engine_setting_is_read_somewhere():
    from octavo.config import FIELD_SECTION

    code = _code()
    unread = [name for name, section in FIELD_SECTION.items() if name not in PERMISSIONS
              and not re.search(rf"\.{section}\.{name}\b|\b{section}\.{name}\b|[\"']{name}[\"']|\.{name}\b", code)]
    assert not unread, f"settings nothing reads (silently ignored): {unread}"


# ------------------------------------------------------------------------------------ vLLM's other LLM methods
def test_enqueue_then_wait_for_completion(llm):
    rids = llm.enqueue([PROMPT, "Hello"], SamplingParams(**G))
    assert len(rids) == 2 and llm.llm_engine.has_unfinished_requests()  # queued, not run yet
    outs = llm.wait_for_completion(use_tqdm=False)
    assert [o.request_id for o in outs] == rids and outs[0].outputs[0].token_ids == ids(llm)
    assert llm.wait_for_completion(use_tqdm=False) == []


def test_profile_writes_a_trace(llm, tmp_path):
    llm.start_profile(str(tmp_path))
    run(llm, max_tokens=2)
    llm.stop_profile()
    assert any(tmp_path.iterdir()), "the profiler wrote no trace"


def test_beam_search_and_pooling_params(llm):
    from octavo.beam_search import BeamSearchParams

    beams = llm.beam_search([PROMPT], BeamSearchParams(beam_width=2, max_tokens=3))[0].sequences
    assert len(beams) == 2 and beams[0].tokens != beams[1].tokens and beams[0].score >= beams[1].score
    refused("pooling_params", llm.encode, [PROMPT], pooling_params=object())
