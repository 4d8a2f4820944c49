"""``shutdown()`` of an in-process engine gives its weights and KV cache back while the ``LLM`` object lives on.

Found on an H100: a benchmark that shut one engine down and built a second in the same process got 0 MiB of
KV cache, because the first engine's worker (and so its model and cache) stayed reachable from the ``LLM``.
Here the same is checked on CPU with weak references: after ``shutdown()`` nothing holds the model or a cache
tensor, and a second engine builds and generates (its GPU side, ``empty_cache``, runs only on a device).
"""

from __future__ import annotations

import gc
import shutil
import sys
import weakref
from pathlib import Path

import pytest
import transformers as T

from octavo import LLM, SamplingParams
from octavo.testing.model import randomize_

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from utils import smollm2_safetensors_dir  # noqa: E402

CFG = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=2)
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("release")
    model = T.LlamaForCausalLM(T.LlamaConfig(architectures=["LlamaForCausalLM"], **CFG)).float()
    randomize_(model, seed=0)
    model.save_pretrained(path)
    src = smollm2_safetensors_dir("float32")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / name, path / name)
    return str(path)


def test_shutdown_frees_the_model_and_cache_while_llm_lives(tiny):
    llm = LLM(tiny, dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=256)
    first = llm.generate(["The capital of France is"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    worker = llm.llm_engine.core.executor.driver
    model, cache = weakref.ref(worker.model), weakref.ref(worker.kv_caches[0])
    del worker
    llm.llm_engine.shutdown()
    gc.collect()
    assert model() is None, "the model is still reachable after shutdown()"
    assert cache() is None, "a KV cache tensor is still reachable after shutdown()"

    again = LLM(tiny, dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=256)
    try:
        assert again.generate(["The capital of France is"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == first
    finally:
        again.llm_engine.shutdown()
    del llm


def test_dropping_an_async_llm_releases_its_model_and_step_thread(tiny):
    """Without ``shutdown()``: an ``LLM`` with async scheduling (one step thread of the in-process executor; the
    default on CUDA), once dropped, leaves neither its model nor its step thread behind."""
    import threading

    before = set(threading.enumerate())
    llm = LLM(tiny, dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=256, async_scheduling=True)
    llm.generate(["The capital of France is"], GREEDY, use_tqdm=False)
    model = weakref.ref(llm.llm_engine.core.executor.driver.model)
    steps = [t for t in set(threading.enumerate()) - before if t.name.startswith("octavo-step")]
    assert steps, "the async step thread should be running"
    del llm
    gc.collect()
    assert model() is None, "the model is still reachable after the LLM was dropped"
    for t in steps:
        t.join(30)  # the pool's worker exits once the pool is collected
    assert not any(t.is_alive() for t in steps), "the step thread outlived its LLM"
