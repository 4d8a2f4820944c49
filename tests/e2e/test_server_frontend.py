"""The shared front end (``octavo.frontend.FrontEnd``) on the embedded model: unique internal ids behind
colliding client ids, a core error output finishing its request (all its sequences), validation errors
naming the field, and ``reset_prefix_cache`` through ``LLM``."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from octavo.core.messages import EngineCoreOutput, FinishReason
from octavo.errors import InputError


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=256, kv_cache_memory_bytes=32 << 20, enable_prefix_caching=True)


def test_colliding_client_ids_run_as_distinct_requests(llm):
    fe = llm.llm_engine.frontend
    a, reqs_a = fe.submit("same", "Hello", SamplingParams(max_tokens=1, n=2))
    b, reqs_b = fe.submit("0_same", "Hello", SamplingParams(max_tokens=1))
    c, _ = fe.submit("same", "Hello", SamplingParams(max_tokens=1))
    seq_ids = [r.request_id for r in reqs_a + reqs_b]
    assert len({a, b, c}) == 3 and len(set(seq_ids)) == len(seq_ids)
    assert fe.client_id(a) == fe.client_id(c) == "same" and fe.client_id(b) == "0_same"
    fe.abort([a, b, c])
    assert not fe.has_unfinished()


def test_core_error_finishes_the_whole_request(llm):
    fe = llm.llm_engine.frontend
    rid, reqs = fe.submit("client-1", "Hello", SamplingParams(max_tokens=4, n=3))
    first, *siblings = [r.request_id for r in reqs]
    err = EngineCoreOutput(request_id=first, new_token_ids=[], finish_reason=FinishReason.ERROR,
                           error=f"request {first}: the core refused it")
    results, to_abort = fe.process_outputs([err])
    assert sorted(to_abort) == sorted(siblings)
    [(internal, out, message)] = results
    assert internal == rid and out.request_id == "client-1" and out.finished
    assert message == f"request {first.replace(rid, 'client-1')}: the core refused it"  # no internal id
    assert [c.finish_reason for c in out.outputs] == ["error"] * 3
    assert not fe.has_unfinished() and fe.parent_of(first) is None


@pytest.mark.parametrize("prompt,params,param", [
    ({"prompt_token_ids": [10**9]}, SamplingParams(), "prompt"),
    ("x " * 300, SamplingParams(), "prompt"),
    ("Hi", SamplingParams(logprobs=10**4), "logprobs"),
    ("Hi", SamplingParams(seed=2**70), "seed"),
])
def test_input_errors_name_the_field(llm, prompt, params, param):
    with pytest.raises(InputError) as e:
        llm.llm_engine.frontend.submit("r", prompt, params)
    assert e.value.param == param
    assert not llm.llm_engine.frontend.has_unfinished()


def test_render_chat_errors_are_input_errors(llm):
    eng = llm.llm_engine
    text, ids = eng.render_chat([{"role": "user"}, {"role": "assistant", "content": None}])
    assert ids and isinstance(text, str)
    for kwargs, param in (({"chat_template": "{% include 'x' %}"}, "chat_template"),
                          ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs")):
        with pytest.raises(InputError) as e:
            eng.render_chat([{"role": "user", "content": "x"}], **kwargs)
        assert e.value.param == param


def test_reset_prefix_cache(llm):
    prompt = "The quick brown fox jumps over the lazy dog. " * 3  # two full KV blocks or more
    params = SamplingParams(max_tokens=1, temperature=0)
    llm.generate(prompt, params, use_tqdm=False)
    assert llm.generate(prompt, params, use_tqdm=False)[0].num_cached_tokens > 0
    assert llm.reset_prefix_cache() is True
    assert llm.generate(prompt, params, use_tqdm=False)[0].num_cached_tokens == 0
