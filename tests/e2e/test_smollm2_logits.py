"""The real SmolLM2-135M-Instruct GGUF through octavo's loader, the Llama plugin and the torch_sdpa backend
gives the same prompt logits as transformers on the same dequantized weights — prompts run together in one
flat batch, and a prompt fed as chunks then decodes over the paged cache.

Two references: in float64 both implementations must agree to 2e-5 (what is left is float32 rounding of the
returned logits); in float32 octavo's error against transformers' float64 logits may be at most 1e-4, or
twice transformers' own float32 error where the CPU's GEMM kernels round more than that (e.g. AVX-512 vs
AVX2 accumulation order), so the bound follows the machine instead of a constant tuned on one ISA."""

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
ATOL_F64 = 2e-5


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(ModelSettings(model=smollm2_gguf_path()))


@pytest.fixture(scope="module")
def prompts(tokenizer):
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is a KV cache?"}], tokenize=False,
                                         add_generation_prompt=True)
    return [tokenizer(p)["input_ids"] for p in PROMPTS] + [tokenizer(chat, add_special_tokens=False)["input_ids"]]


def _octavo(dtype):
    from octavo.plugins.models.llama import LlamaForCausalLM

    resolved = resolve_model(ModelSettings(model=smollm2_gguf_path()))
    return load_model(resolved, model_cls=LlamaForCausalLM, dtype=dtype, device="cpu")


def _hf(dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_safetensors_dir("float32"), dtype=dtype).eval()


@pytest.fixture(scope="module")
def octavo_model():
    return _octavo(torch.float32)


@pytest.fixture(scope="module")
def reference():
    return _hf(torch.float32)


@pytest.fixture(scope="module")
def reference64():
    return _hf(torch.float64)


def _ref_logits(reference, ids):
    with torch.no_grad():
        return reference(torch.tensor([ids])).logits[0].double()


def _assert_close(got, want, what, atol=ATOL):
    got, want = got.double(), want.double()
    err = (got - want).abs().max().item()
    lp = (torch.log_softmax(got, -1) - torch.log_softmax(want, -1)).abs().max().item()
    assert err <= atol and lp <= atol, f"{what}: max logit diff {err:.3g}, logprob diff {lp:.3g} (bound {atol:.3g})"
    assert torch.equal(got.argmax(-1), want.argmax(-1)), f"{what}: greedy tokens differ"


def test_float64_prompt_logits_match_transformers_float64(reference64, prompts):
    got = PagedRunner(_octavo(torch.float64), block_size=16).prompts(prompts)
    for ids, logits in zip(prompts, got):
        _assert_close(logits, _ref_logits(reference64, ids), f"float64 prompt of {len(ids)} tokens", ATOL_F64)


def test_prompt_logits_match_transformers(octavo_model, reference, reference64, prompts):
    """float32: octavo's error against the float64 logits is within 1e-4, or within twice transformers' own
    float32 error on this CPU, whichever is larger."""
    got = PagedRunner(octavo_model, block_size=16).prompts(prompts)
    for ids, logits in zip(prompts, got):
        exact = _ref_logits(reference64, ids)
        hf32 = _ref_logits(reference, ids)
        hf_err = max((hf32 - exact).abs().max().item(),
                     (torch.log_softmax(hf32, -1) - torch.log_softmax(exact, -1)).abs().max().item())
        _assert_close(logits, exact, f"prompt of {len(ids)} tokens", max(ATOL, 2 * hf_err))


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
