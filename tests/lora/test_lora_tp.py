"""LoRA under tensor parallelism on CPU (gloo, ``mp`` executor, 2 ranks): greedy tokens equal transformers + peft.

The tiny Llama has 4 query / 2 KV heads, so each rank holds half of q, k and v: B of q/k/v and gate/up is
sliced by this rank's output rows, A of o/down by its input columns (their partial deltas are all-reduced),
the embedding adapter stays whole. Adapters of different rank / targets (one with an embedding LoRA) run alone
and mixed with the base model in one batch. Two worker processes start: ``make lora`` (``OCTAVO_LORA=full``).
"""

from __future__ import annotations

import os

import pytest

from octavo import LLM, SamplingParams
from octavo.lora.request import LoRARequest
from tests.lora.conftest import ADAPTERS, make_adapter, make_base, peft_greedy

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.environ.get("OCTAVO_LORA") != "full",
                                                   reason="OCTAVO_LORA=full (make lora) runs it")]
N = 6
PROMPTS = [[5, 9, 30, 7], list(range(3, 40)), [11, 12, 13] * 7]


def test_tensor_parallel_lora_equals_peft(tmp_path):
    base = str(tmp_path / "base")
    make_base(base)
    loras, want = [], {None: peft_greedy(base, None, PROMPTS, N)}
    for i in (0, 2, 4):  # all seven projections; q/v only (rank 16); embed_tokens + q + down
        path = str(tmp_path / f"a{i}")
        make_adapter(base, path, *ADAPTERS[i], seed=400 + i)
        loras.append(LoRARequest(f"a{i}", i + 1, path))
        want[i + 1] = peft_greedy(base, path, PROMPTS, N)
        assert want[i + 1] != want[None]  # else equality below would not show the adapter was applied
    llm = LLM(base, dtype="float32", skip_tokenizer_init=True, enable_lora=True, max_loras=3, max_lora_rank=16,
              kv_cache_memory_bytes=8 << 20, max_model_len=128, block_size=8, seed=0, max_num_batched_tokens=32,
              tensor_parallel_size=2)
    params = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    try:
        choices = [None, *loras, loras[2], loras[0]]
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(choices))]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                            lora_request=choices)
        for i, (lora, out) in enumerate(zip(choices, outs)):
            key = None if lora is None else lora.lora_int_id
            assert list(out.outputs[0].token_ids) == want[key][i % len(PROMPTS)], (i, lora)
    finally:
        llm.llm_engine.shutdown()
