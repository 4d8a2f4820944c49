"""The CPU default path (issue 18): bfloat16 where the CPU computes it natively, float32 elsewhere, on the
embedded SmolLM2 as shipped. tests/conftest.py pins the rest of the suite to float32; this module unsets
that to run what a user gets from ``LLM()``."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from octavo.plugins.platforms.cpu import CpuPlatform

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def default_llm():
    mp = pytest.MonkeyPatch()
    mp.delenv("OCTAVO_DTYPE", raising=False)
    try:
        yield LLM(max_model_len=256, kv_cache_memory_bytes=32 << 20)
    finally:
        mp.undo()


def test_default_dtype_is_the_platform_default(default_llm):
    assert default_llm.llm_engine.model_info.dtype == CpuPlatform().default_dtype()


def test_default_path_answers_sensibly(default_llm):
    tok = default_llm.get_tokenizer()
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    out = default_llm.generate([prompt, "The capital of France is"],
                               SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert "Paris" in out[0].outputs[0].text, out[0].outputs[0].text
    assert "Paris" in out[1].outputs[0].text, out[1].outputs[0].text
