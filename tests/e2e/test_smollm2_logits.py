"""The real SmolLM2-135M-Instruct GGUF through octavo's loader, the Llama plugin and the torch_sdpa backend
gives the same prompt logits as transformers (same dequantized weights, float32) within 1e-4 — prompts run
together in one flat batch, and a prompt fed as chunks then decodes over the paged cache."""

from __future__ import annotations

import pytest
import torch

from octavo.config import ModelSettings
from octavo.core.loader import load_model, load_tokenizer, resolve_model
from octavo.testing.model import PagedRunner
from tests.utils import smollm2_gguf_path, smollm2_safetensors_dir

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "日本の首都は",
]
ATOL = 1e-4


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(ModelSettings(model=smollm2_gguf_path()))


@pytest.fixture(scope="module")
def prompts(tokenizer):
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is a KV cache?"}], tokenize=False,
                                         add_generation_prompt=True)
    return [tokenizer(p)["input_ids"] for p in PROMPTS] + [tokenizer(chat, add_special_tokens=False)["input_ids"]]


@pytest.fixture(scope="module")
def octavo_model():
    from octavo.plugins.models.llama import LlamaForCausalLM

    resolved = resolve_model(ModelSettings(model=smollm2_gguf_path()))
    return load_model(resolved, model_cls=LlamaForCausalLM, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_safetensors_dir("float32"), dtype=torch.float32).eval()


def _ref_logits(reference, ids):
    with torch.no_grad():
        return reference(torch.tensor([ids])).logits[0].float()


def _assert_close(got, want, what):
    err = (got - want).abs().max().item()
    lp = (torch.log_softmax(got, -1) - torch.log_softmax(want, -1)).abs().max().item()
    assert err <= ATOL and lp <= ATOL, f"{what}: max logit diff {err:.3g}, logprob diff {lp:.3g}"
    assert torch.equal(got.argmax(-1), want.argmax(-1)), f"{what}: greedy tokens differ"


def test_prompt_logits_match_transformers(octavo_model, reference, prompts):
    got = PagedRunner(octavo_model, block_size=16).prompts(prompts)
    for ids, logits in zip(prompts, got):
        _assert_close(logits, _ref_logits(reference, ids), f"prompt of {len(ids)} tokens")


def test_chunked_prefill_then_greedy_decode_match(octavo_model, reference, prompts):
    """Prefill in chunks of 7, then 8 greedy tokens one at a time: logits and tokens equal transformers'."""
    ids = list(prompts[-1])
    runner = PagedRunner(octavo_model, block_size=16)
    chunks = []
    for start in range(0, len(ids), 7):
        chunks.append(runner.step([("r", ids[start:start + 7])])[0])
    for _ in range(8):
        ids.append(int(chunks[-1][-1].argmax()))
        chunks.append(runner.step([("r", ids[-1:])])[0])
    _assert_close(torch.cat(chunks)[:-1], _ref_logits(reference, ids)[:-1], "chunked + decode")
