"""``collective_rpc`` and sleep mode through the ``mp`` executor (worker processes; issue 16). Full mode only
(``make distributed``): the in-process path runs in ``make test`` (tests/e2e/test_sleep_mode.py)."""

from __future__ import annotations

import os

import pytest
import torch
import transformers as T

from octavo import LLM, SamplingParams
from octavo.testing.model import randomize_

pytestmark = pytest.mark.skipif(os.environ.get("OCTAVO_DISTRIBUTED") != "full",
                                reason="OCTAVO_DISTRIBUTED=full (make distributed) runs it")
CFG = dict(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
           tie_word_embeddings=False)
PROMPTS = [{"prompt_token_ids": [5, 17, 33, 9, 100, 7]}, {"prompt_token_ids": [1, 44, 90, 12]}]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def test_mp_executor_collective_rpc_and_sleep(tmp_path):
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(architectures=["LlamaForCausalLM"], **CFG)).float()
    randomize_(model)
    model.save_pretrained(tmp_path / "llama")
    llm = LLM(str(tmp_path / "llama"), skip_tokenizer_init=True, dtype="float32", enable_sleep_mode=True,
              kv_cache_memory_bytes=32 << 20, max_model_len=256, distributed_executor_backend="mp")

    def tokens():
        return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]

    try:
        before = tokens()
        [num_loaded] = llm.collective_rpc("reload_weights")  # every parameter tensor (qkv, gate_up packed)
        assert num_loaded == 2 + 2 * 5 + 1 + 2 and tokens() == before
        assert llm.collective_rpc("info")[0]["num_blocks"] > 0  # over msgpack a struct comes back as a dict
        with pytest.raises(TypeError, match="no pickled code"):
            llm.collective_rpc(lambda worker: 1)
        assert llm.sleep(2)["weights_discarded_bytes"] > 0
        llm.wake_up()
        assert tokens() == before
    finally:
        llm.llm_engine.shutdown()
