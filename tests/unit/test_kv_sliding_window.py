"""Sliding-window models release KV blocks that fell out of the window (``KVCacheManager.free_out_of_window_blocks``):
a model whose every layer has window W keeps only about W tokens of blocks per request, and its outputs
stay exactly transformers' (a generation far longer than the cache could otherwise hold)."""

from __future__ import annotations

import torch
import transformers as T

from octavo.core.kv_cache.manager import KVCacheManager


def test_manager_releases_blocks_before_the_window():
    kv = KVCacheManager(num_blocks=32, block_size=4, enable_caching=True, sliding_window=8)
    kv.req_blocks["r"] = kv.pool.allocate(10)  # 40 tokens' worth
    kv.req_block_ids["r"] = [b.block_id for b in kv.req_blocks["r"]]
    free_before = kv.pool.num_free_blocks
    # queries from position 40 see positions >= 33: blocks 0..7 cover 0..31; one block of margin keeps block 7
    assert kv.free_out_of_window_blocks("r", 40) == 7
    assert kv.pool.num_free_blocks == free_before + 7
    assert kv.block_ids("r")[:7] == [0] * 7 and 0 not in kv.block_ids("r")[7:]
    assert kv.free_out_of_window_blocks("r", 40) == 0  # idempotent
    no_window = KVCacheManager(num_blocks=32, block_size=4, enable_caching=True)
    no_window.req_blocks["r"] = no_window.pool.allocate(10)
    assert no_window.free_out_of_window_blocks("r", 40) == 0


def test_long_generation_in_a_small_cache_matches_transformers(tmp_path):
    from octavo import LLM, SamplingParams
    from octavo.testing.model import randomize_
    from tests.plugins.test_model_contracts import TINY, save_word_tokenizer

    config = T.MistralConfig(architectures=["MistralForCausalLM"], sliding_window=8, **TINY)
    torch.manual_seed(0)
    ref = randomize_(T.AutoModelForCausalLM.from_config(config, dtype=torch.float32)).eval()
    ref.save_pretrained(tmp_path)
    save_word_tokenizer(str(tmp_path))
    prompt = list(range(3, 33))  # 30 tokens, then 40 more: 70 tokens, but the cache holds 5 x 8 = 40
    llm = LLM(str(tmp_path), dtype="float32", block_size=8, num_gpu_blocks_override=6, max_model_len=128,
              enable_prefix_caching=False)
    assert llm.llm_engine.core.kv.sliding_window == 8
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                       use_tqdm=False)[0]
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(40):
            seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
    assert list(out.outputs[0].token_ids) == seq[len(prompt):]
