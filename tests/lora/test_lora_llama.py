"""LoRA on a tiny random-weight Llama: octavo's greedy tokens equal transformers + peft, per adapter and mixed.

One engine for the module with ``max_loras=2`` and ``max_cpu_loras=3`` but four adapters, so a mixed batch
also exercises the scheduler's per-step adapter limit (the runner refuses a step with more adapters than
slots) and both LRUs (device slots and host cache). Adapters differ in rank, scaling (one rslora) and
targets (all seven projections, q/v only, o/up/down only), so the fused q/k/v and gate/up mapping is checked.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.lora.request import LoRARequest
from tests.lora.conftest import ADAPTERS, make_adapter, make_base, peft_greedy

N = 8
PROMPTS = [[5, 9, 30, 7], list(range(3, 40)), [11, 12, 13] * 7]
GREEDY = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = str(root / "base")
    make_base(base)
    loras, want = [], {None: peft_greedy(base, None, PROMPTS, N)}
    for i, (rank, alpha, rslora, targets) in enumerate(ADAPTERS):
        path = str(root / f"adapter{i}")
        make_adapter(base, path, rank, alpha, rslora, targets, seed=100 + i)
        lora = LoRARequest(f"a{i}", i + 1, path)
        loras.append(lora)
        want[lora.lora_int_id] = peft_greedy(base, path, PROMPTS, N)
    llm = LLM(base, dtype="float32", skip_tokenizer_init=True, enable_lora=True, max_loras=2, max_cpu_loras=3,
              max_lora_rank=16, kv_cache_memory_bytes=16 << 20, max_model_len=256, block_size=8, seed=0,
              max_num_batched_tokens=32)  # the 37-token prompt is prefilled in two chunks
    yield llm, loras, want, root
    llm.llm_engine.shutdown()


def _gen(llm, prompts, loras):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False, lora_request=loras)
    return [list(o.outputs[0].token_ids) for o in outs], outs


def test_adapters_change_the_output(setup):
    _, loras, want, _ = setup
    for lora in loras:  # else equality below would not show that the adapter was applied
        assert want[lora.lora_int_id] != want[None]


def test_each_adapter_equals_peft(setup):
    llm, loras, want, _ = setup
    for lora in [None, *loras]:
        got, _ = _gen(llm, PROMPTS, [lora] * len(PROMPTS))
        assert got == want[None if lora is None else lora.lora_int_id], lora


def test_mixed_batch_gives_each_request_its_adapter(setup):
    llm, loras, want, _ = setup
    choices = [None, *loras, *loras[::-1], None, loras[0]]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(choices))]
    got, _ = _gen(llm, prompts, choices)
    for i, (lora, tokens) in enumerate(zip(choices, got)):
        assert tokens == want[None if lora is None else lora.lora_int_id][i % len(PROMPTS)], (i, lora)


def test_prefix_cache_never_crosses_adapters(setup):
    llm, loras, want, _ = setup
    prompt = PROMPTS[1]  # 37 tokens: 4 full blocks of 8
    llm.reset_prefix_cache()
    _, first = _gen(llm, [prompt], [loras[0]])
    got, other = _gen(llm, [prompt], [loras[1]])  # same tokens, another adapter: nothing reused
    assert other[0].num_cached_tokens == 0 and got[0] == want[loras[1].lora_int_id][1]
    got, base = _gen(llm, [prompt], [None])
    assert base[0].num_cached_tokens == 0 and got[0] == want[None][1]
    got, again = _gen(llm, [prompt], [loras[0]])  # the same adapter again: its blocks are reused
    assert again[0].num_cached_tokens == 32 and got[0] == want[loras[0].lora_int_id][1]


def test_bad_adapters_fail_their_request_only(setup):
    llm, loras, want, root = setup
    big = root / "big"
    big.mkdir(exist_ok=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        src = os.path.join(loras[0].lora_path, name)
        (big / name).write_bytes(open(src, "rb").read())
    cfg = json.loads((big / "adapter_config.json").read_text())
    (big / "adapter_config.json").write_text(json.dumps({**cfg, "r": 32}))
    with pytest.raises(ValueError, match="max_lora_rank=16"):
        _gen(llm, [PROMPTS[0]], [LoRARequest("big", 50, str(big))])
    with pytest.raises(ValueError, match="adapter_config.json"):
        _gen(llm, [PROMPTS[0]], [LoRARequest("missing", 51, str(root / "nowhere"))])
    # shapes are checked where the model is (the runner): that request fails, the others in its batch run
    from safetensors.torch import load_file, save_file

    shaped = root / "shaped"
    shaped.mkdir(exist_ok=True)
    (shaped / "adapter_config.json").write_text(json.dumps(cfg))
    tensors = load_file(os.path.join(loras[0].lora_path, "adapter_model.safetensors"))
    key = next(k for k in tensors if "up_proj.lora_B" in k)
    tensors[key] = tensors[key][:96].contiguous()  # trained on a model with intermediate_size 96
    save_file(tensors, str(shaped / "adapter_model.safetensors"))
    got, outs = _gen(llm, PROMPTS, [loras[0], LoRARequest("shaped", 52, str(shaped)), None])
    assert outs[1].outputs[0].finish_reason == "error" and not got[1]
    assert got[0] == want[loras[0].lora_int_id][0] and got[2] == want[None][2]
    got, _ = _gen(llm, [PROMPTS[0]], [loras[0]])  # the engine still serves
    assert got[0] == want[loras[0].lora_int_id][0]


def test_embedding_adapter_checks_its_base_table(setup):
    """An embedding adapter whose saved base table is not this model's fails its request (never served with the
    base table instead); an lm_head adapter is refused by name."""
    llm, loras, want, root = setup
    from safetensors.torch import load_file, save_file

    emb = loras[4]
    src = load_file(os.path.join(emb.lora_path, "adapter_model.safetensors"))
    for name, edit in [("retrained", "base_layer"), ("head", "lm_head")]:
        d = root / name
        d.mkdir(exist_ok=True)
        (d / "adapter_config.json").write_bytes(open(os.path.join(emb.lora_path, "adapter_config.json"), "rb").read())
        tensors = dict(src)
        if edit == "base_layer":
            key = next(k for k in tensors if k.endswith("embed_tokens.base_layer.weight"))
            tensors[key] = tensors[key] + 1.0
        else:
            tensors["base_model.model.lm_head.lora_A.weight"] = torch.zeros(8, 64)
            tensors["base_model.model.lm_head.lora_B.weight"] = torch.zeros(256, 8)
        save_file(tensors, str(d / "adapter_model.safetensors"))
        got, outs = _gen(llm, PROMPTS[:2], [LoRARequest(name, 60 + len(name), str(d)), emb])
        assert outs[0].outputs[0].finish_reason == "error" and not got[0], name
        assert got[1] == want[emb.lora_int_id][1]


def test_lora_request_without_enable_lora_is_refused(setup):
    _, loras, _, root = setup
    from octavo.config import OctavoSettings
    from octavo.lora.adapter import check_lora_request

    with pytest.raises(ValueError, match="enable_lora"):
        check_lora_request(loras[0], OctavoSettings.from_kwargs())
