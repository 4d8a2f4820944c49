"""``LLM.sleep`` / ``wake_up`` / ``collective_rpc`` (issue 16), on a random-weight Llama of ~70 MB.

Measured, not assumed: the process's RSS falls by about the KV cache's size at level 1 (weights stay: on a
CPU they are host memory already) and by KV cache + weights at level 2; greedy output after ``wake_up``
equals the output before ``sleep``. ``collective_rpc`` runs worker methods by name, ``module:function`` and
callables in-process (through the ``mp`` executor's worker processes: tests/distributed/test_sleep_rpc_mp.py).
"""

from __future__ import annotations

import gc

import psutil
import pytest
import transformers as T

from octavo import LLM, SamplingParams
from tests.utils import tiny_llama

CFG = dict(vocab_size=16384, hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
           num_key_value_heads=4, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
           tie_word_embeddings=False)
KV_BYTES = 96 << 20
PROMPTS = [{"prompt_token_ids": [5, 17, 33, 9, 100, 7]}, {"prompt_token_ids": [1, 44, 90, 12]}]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def num_blocks(worker) -> int:  # for collective_rpc("module:function")
    return worker.num_blocks


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("sleep") / "llama"
    tiny_llama(path, CFG)
    return str(path)


@pytest.fixture(scope="module")
def llm(model_dir):
    # a resident cache (written at allocation and at wake_up): the default calloc'd CPU cache (core/lazy_zeros.py)
    # holds only the pages requests touched, so the RSS it frees would measure the workload, not sleep
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OCTAVO_LAZY_KV_CACHE", "0")
        llm = LLM(model_dir, skip_tokenizer_init=True, dtype="float32", enable_sleep_mode=True,
                  kv_cache_memory_bytes=KV_BYTES, max_model_len=256)
        yield llm


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def _tokens(llm) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_sleep_levels_free_memory_and_wake_up_restores(llm):
    before = _tokens(llm)
    weights = sum(p.numel() * 4 for p in T.LlamaForCausalLM(T.LlamaConfig(**CFG)).parameters())
    rss0 = _rss()
    freed = llm.sleep(level=1)
    drop1 = rss0 - _rss()
    assert llm.is_sleeping() and freed["kv_cache_bytes"] >= 0.9 * KV_BYTES and freed["weights_offloaded_bytes"] == 0
    assert drop1 > 0.8 * freed["kv_cache_bytes"], (drop1, freed)
    with pytest.raises(ValueError, match="asleep"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.wake_up()
    assert not llm.is_sleeping() and _tokens(llm) == before

    rss0 = _rss()
    freed = llm.sleep(level=2)
    drop2 = rss0 - _rss()
    assert freed["weights_discarded_bytes"] == pytest.approx(weights, rel=0.01)
    assert drop2 > 0.8 * (freed["kv_cache_bytes"] + freed["weights_discarded_bytes"]), (drop2, freed)
    llm.wake_up(tags=["weights"])  # vLLM's two-phase wake: weights first, then the cache
    assert llm.is_sleeping()
    llm.wake_up(tags=["kv_cache"])
    assert not llm.is_sleeping() and _tokens(llm) == before
    print(f"\nRSS freed: level 1 {drop1 / 2**20:.0f} MiB (KV {freed['kv_cache_bytes'] / 2**20:.0f} MiB), "
          f"level 2 {drop2 / 2**20:.0f} MiB (+ weights {weights / 2**20:.0f} MiB)")


def test_sleep_refusals(llm, model_dir):
    with pytest.raises(ValueError, match="level"):
        llm.sleep(level=3)
    with pytest.raises(ValueError, match="wake_up tags"):
        llm.sleep(1)
        try:
            llm.wake_up(tags=["everything"])
        finally:
            llm.wake_up()
    llm.enqueue(PROMPTS[:1], GREEDY)
    with pytest.raises(ValueError, match="still running or waiting"):
        llm.sleep(1)
    llm.wait_for_completion(use_tqdm=False)


def test_collective_rpc_in_process(llm):
    info = llm.collective_rpc("info")
    assert len(info) == 1 and info[0].num_blocks > 0
    assert llm.collective_rpc(f"{__name__}:num_blocks") == [info[0].num_blocks]
    assert llm.collective_rpc(lambda worker, x: x + worker.block_size, args=(1,)) == [1 + info[0].block_size]
    with pytest.raises(AttributeError, match="no public method"):
        llm.collective_rpc("_allocate_kv_cache")


def test_sleep_mode_off_is_refused(model_dir, llm):
    llm.llm_engine.settings.model.enable_sleep_mode = False
    try:
        with pytest.raises(ValueError, match="enable_sleep_mode"):
            llm.sleep(1)
    finally:
        llm.llm_engine.settings.model.enable_sleep_mode = True
