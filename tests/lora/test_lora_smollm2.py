"""LoRA on the embedded SmolLM2-135M (real weights): greedy tokens with PEFT adapters equal transformers + peft.

Two adapters built with ``peft`` on the same float32 checkpoint (all seven projections at rank 8; q/v only at
rank 4 with rslora), each alone and mixed with the base model in one batch, with chunked prefill (a 16-token
budget splits the prompts across steps).
"""

from __future__ import annotations

import os

import pytest

from octavo import LLM, SamplingParams
from octavo.lora.request import LoRARequest
from tests.lora.conftest import ALL, peft_greedy
from tests.utils import smollm2_safetensors_dir

# ~2 min of CPU (a 135M model, references without a KV cache): `make lora` runs it, `make test` the tiny Llama
pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.environ.get("OCTAVO_LORA") != "full",
                                                   reason="OCTAVO_LORA=full (make lora) runs it")]
N = 8
PROMPTS = [[1, 504, 3458, 282, 4649, 314], list(range(100, 130))]


def _make_adapter(base: str, path: str, rank: int, alpha: int, rslora: bool, targets, seed: int) -> None:
    import torch
    import transformers as T
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(T.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                           LoraConfig(r=rank, lora_alpha=alpha, use_rslora=rslora, target_modules=targets))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = str(smollm2_safetensors_dir("float32"))
    root = tmp_path_factory.mktemp("lora_smollm2")
    loras = []
    want = {None: peft_greedy(base, None, PROMPTS, N, auto=True)}
    for i, (rank, alpha, rslora, targets) in enumerate([(8, 16, False, ALL), (4, 8, True, ["q_proj", "v_proj"])]):
        path = str(root / f"a{i}")
        _make_adapter(base, path, rank, alpha, rslora, targets, seed=300 + i)
        loras.append(LoRARequest(f"a{i}", i + 1, path))
        want[i + 1] = peft_greedy(base, path, PROMPTS, N, auto=True)
    llm = LLM(base, dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8, max_model_len=256,
              max_num_batched_tokens=16, kv_cache_memory_bytes=32 << 20, seed=0)
    yield llm, loras, want
    llm.llm_engine.shutdown()


def test_smollm2_adapters_equal_peft_alone_and_mixed(setup):
    llm, loras, want = setup
    params = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    for lora in loras:
        assert want[lora.lora_int_id] != want[None]
    choices = [loras[0], None, loras[1], loras[1], loras[0], None]
    prompts = [PROMPTS[i % 2] for i in range(len(choices))]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, lora_request=choices)
    for i, (lora, out) in enumerate(zip(choices, outs)):
        assert list(out.outputs[0].token_ids) == want[lora.lora_int_id if lora else None][i % 2], (i, lora)
