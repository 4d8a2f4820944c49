"""The embedded SmolLM2-135M Q4_1 GGUF runs with 4-bit weights on CPU and agrees with its fp32 dequantized run.

Done-when of issue 9: >= 95% of greedy tokens agree over 12 prompts x 48 tokens, and the per-token
log-likelihood of a fixed text is within 1% of fp32. With octavo's fp32 CPU kernels (plugins/quant/cpu_kernel.py)
the 4-bit path computes what the fp32 path computes, to fp32 rounding, so the bounds here are much tighter
than the issue's (measured: 100% and 0.00%); torch's bf16 int4 kernel gave 97.0% and 0.18%, and flipped the
chat answer checked below (docs/quantization.md). Agreement is per decision under the same context:
the fp32 model decodes greedily and the 4-bit model, fed the fp32 tokens, must pick the same next token
(two free-running decodes part at the first near tie and then compare unrelated text).
"""

from __future__ import annotations

import pytest
import torch

from octavo.core.loader.gguf_file import gguf_tokenizer
from octavo.core.loader.resolve import default_model_path
from octavo.plugins.quant.kernels import Int4GroupMethod
from octavo.testing.model import PagedRunner
from tests.quant.helpers import greedy, load, token_logprobs

PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
    "The three primary colors are", "Water boils at", "To make a cup of tea, first",
    "The largest planet in the solar system is", "import numpy as np\n", "Photosynthesis is the process",
    "My favourite book is", "The quick brown fox", "In 1969, the first humans",
]
TEXT = ("The sun rose slowly over the quiet hills, and the village began to wake. Bakers opened their shops, "
        "children ran to school, and the old clock in the square struck seven.")


@pytest.fixture(scope="module")
def models():
    path = default_model_path()
    tokenizer = gguf_tokenizer(path)
    quantized, quantizer = load(path, None)
    dense, _ = load(path, "none")
    return tokenizer, quantized, quantizer, dense


def test_linear_layers_are_4bit(models):
    _, quantized, quantizer, _ = models
    assert quantizer.name == "gguf"
    layers = [m for m in quantized.modules() if hasattr(m, "quant_method")]
    assert layers and all(isinstance(m.quant_method, Int4GroupMethod) for m in layers)
    assert all(m.w4.dtype == torch.uint8 and m.w4.shape[1] * 2 == m.input_size for m in layers)


def test_greedy_tokens_agree_with_fp32(models):
    """The fp32 run decodes greedily; the 4-bit model, fed the same context, picks the same next token."""
    tokenizer, quantized, _, dense = models
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    want, _ = greedy(dense, prompts, 48)
    runner = PagedRunner(quantized, num_blocks=64)
    logits = runner.prompts([p + w for p, w in zip(prompts, want)])  # one prefill step, teacher-forced
    picks = [lg[len(p) - 1:-1].argmax(-1).tolist() for lg, p in zip(logits, prompts)]
    rate = sum(a == b for g, w in zip(picks, want) for a, b in zip(g, w)) / sum(len(w) for w in want)
    print(f"4-bit vs fp32 greedy agreement (same context): {rate:.1%}")
    assert rate >= 0.99  # the issue asks >= 0.95; the fp32 kernels give 100% here


def test_chat_answer_equals_fp32(models):
    """The headline prompt whose answer torch's bf16 int4 kernel flipped ("Paris" -> "L'Etoile, ...")."""
    tokenizer, quantized, _, dense = models
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                         add_generation_prompt=True, tokenize=True)
    chat = list(chat["input_ids"] if hasattr(chat, "keys") else chat)
    want, _ = greedy(dense, [chat], 12)
    got, _ = greedy(quantized, [chat], 12)
    assert "Paris" in tokenizer.decode(want[0])
    assert got == want, (tokenizer.decode(got[0]), tokenizer.decode(want[0]))


def test_log_likelihood_within_one_percent(models):
    tokenizer, quantized, _, dense = models
    tokens = tokenizer.encode(TEXT)
    got, want = token_logprobs(quantized, tokens).mean(), token_logprobs(dense, tokens).mean()
    print(f"per-token log-likelihood: 4-bit {got:.4f}, fp32 {want:.4f}")
    assert abs(got - want) <= 0.001 * abs(want)  # the issue asks 1%; fp32 kernels: equal to 4 decimals
