"""The embedded SmolLM2-135M Q4_1 GGUF runs with 4-bit weights on CPU and agrees with its fp32 dequantized run.

Done-when of issue 9: >= 95% of greedy tokens agree over 12 prompts x 48 tokens, and the per-token
log-likelihood of a fixed text is within 1% of fp32. With octavo's fp32 CPU kernels (plugins/quant/cpu_kernel.py)
the 4-bit path computes what the fp32 path computes, to fp32 rounding, so the bounds here are much tighter
than the issue's (measured: 100% and 0.00%); torch's bf16 int4 kernel gave 97.0% and 0.18%, and flipped the
chat answer checked below (docs/quantization.md). Agreement is per decision under the same context:
the fp32 model decodes greedily and the 4-bit model, fed the fp32 tokens, must pick the same next token
(two free-running decodes part at the first near tie and then compare unrelated text).

GGUF layers run with int8 activations by default, in every step whatever its row count (plugins/quant/
cpu_int8act.py, llama.cpp's Q8 math, batch-invariant; docs/quantization.md "int8 activations"). The
``*_int8_activations`` tests hold that default path to the issue's bars (prefill and decode steps); the
exact-kernel tests switch it off (``OCTAVO_CPU_INT8_ACT=0``) and keep the tight fp32-rounding bounds.
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


@pytest.fixture
def exact_kernels(monkeypatch):
    """``OCTAVO_CPU_INT8_ACT=0``: decode steps keep the fp32-activation kernels (read once per process)."""
    from octavo.plugins.quant import cpu_int8act_ops

    monkeypatch.setenv("OCTAVO_CPU_INT8_ACT", "0")
    monkeypatch.setattr(cpu_int8act_ops, "_state", {})
    assert not cpu_int8act_ops.enabled()


@pytest.fixture
def int8_act_kernels(monkeypatch):
    from octavo.plugins.quant import cpu_int8act_ops

    monkeypatch.setenv("OCTAVO_CPU_INT8_ACT", "1")  # the default (again since session 6); explicit for the test
    monkeypatch.setattr(cpu_int8act_ops, "_state", {})
    if not cpu_int8act_ops.enabled():
        pytest.skip("int8-activation kernels not built here")


@pytest.fixture(scope="module")
def fp32_greedy(models):
    """The fp32 model's greedy tokens for every prompt (the reference of the agreement tests)."""
    tokenizer, _, _, dense = models
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    return prompts, greedy(dense, prompts, 48)[0]


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


def _prefill_agreement(quantized, prompts, want) -> float:
    runner = PagedRunner(quantized, num_blocks=64)
    logits = runner.prompts([p + w for p, w in zip(prompts, want)])  # one prefill step, teacher-forced
    picks = [lg[len(p) - 1:-1].argmax(-1).tolist() for lg, p in zip(logits, prompts)]
    return sum(a == b for g, w in zip(picks, want) for a, b in zip(g, w)) / sum(len(w) for w in want)


def test_greedy_tokens_agree_with_fp32(models, fp32_greedy, exact_kernels):
    """The fp32 run decodes greedily; the 4-bit model, fed the same context, picks the same next token."""
    rate = _prefill_agreement(models[1], *fp32_greedy)
    print(f"4-bit (exact kernels) vs fp32 greedy agreement (same context): {rate:.1%}")
    assert rate >= 0.99  # the issue asks >= 0.95; the fp32 kernels give 100% here


def test_prefill_agrees_with_fp32_int8_activations(models, fp32_greedy, int8_act_kernels):
    """The default path on a prefill step (48 + prompt rows): issue 9's bar."""
    rate = _prefill_agreement(models[1], *fp32_greedy)
    print(f"4-bit int8-activation prefill vs fp32 greedy agreement (same context): {rate:.1%}")
    assert rate >= 0.95


def _decode_picks(model, prompts, want):
    """Teacher-forced DECODE steps: all prompts prefilled, then one step per position with the fp32 tokens fed
    back (12 rows a step, so the decode kernels run); the 4-bit model's argmax at every position."""
    runner = PagedRunner(model, num_blocks=2 + len(prompts) * (1 + (max(map(len, prompts)) + len(want[0])) // 16))
    keys = list(range(len(prompts)))
    picks = [[int(lg[-1].argmax())] for lg in runner.step(list(zip(keys, prompts)))]
    for t in range(len(want[0]) - 1):
        for k, lg in enumerate(runner.step([(k, [want[k][t]]) for k in keys])):
            picks[k].append(int(lg[-1].argmax()))
    return picks


def test_decode_steps_agree_with_fp32_int8_activations(models, fp32_greedy, int8_act_kernels):
    """Issue 9's bar (>= 95%) on the path decode really takes: int8 activations per block of 32."""
    _, quantized, _, _ = models
    prompts, want = fp32_greedy
    picks = _decode_picks(quantized, prompts, want)
    rate = sum(a == b for g, w in zip(picks, want) for a, b in zip(g, w)) / sum(len(w) for w in want)
    print(f"4-bit int8-activation decode vs fp32 greedy agreement (same context): {rate:.1%}")
    assert rate >= 0.95


def test_decode_steps_equal_fp32_with_exact_kernels(models, fp32_greedy, exact_kernels):
    _, quantized, _, _ = models
    prompts, want = fp32_greedy
    picks = _decode_picks(quantized, prompts, want)
    rate = sum(a == b for g, w in zip(picks, want) for a, b in zip(g, w)) / sum(len(w) for w in want)
    assert rate >= 0.99


def _decode_logprobs(model, tokens: list[int]) -> torch.Tensor:
    """Per-token log-likelihood of ``tokens[1:]``, one decode step (one row) per token."""
    runner = PagedRunner(model, num_blocks=4 + len(tokens) // 16)
    out = []
    for t in range(len(tokens) - 1):
        logits = runner.step([("text", [tokens[t]])])[0][-1]
        out.append(torch.log_softmax(logits.double(), -1)[tokens[t + 1]])
    return torch.stack(out)


def test_decode_log_likelihood_within_one_percent_int8_activations(models, int8_act_kernels):
    tokenizer, quantized, _, dense = models
    tokens = tokenizer.encode(TEXT)
    got, want = _decode_logprobs(quantized, tokens).mean(), token_logprobs(dense, tokens).mean()
    print(f"per-token log-likelihood, decode steps: 4-bit int8 activations {got:.4f}, fp32 {want:.4f}")
    assert abs(got - want) <= 0.01 * abs(want)


def test_chat_answer_int8_activations(models, int8_act_kernels):
    """The headline chat prompt under the default path. Its first answer token is a near tie in fp32 ("The" -1.883
    vs "L" -1.965 nat): the int8-activation path picks "L" ("L'Etoile, ..."), as llama.cpp does on the same file
    (llama-cpp-python 0.3.36: "L" -1.884, "The" -1.973). Held here: every pick, scored by the fp32 model under the
    same context, is fp32's own choice or within 0.15 nat of it (measured: 0.082 at the first token, 0 after)."""
    tokenizer, quantized, _, dense = models
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                         add_generation_prompt=True, tokenize=True)
    chat = list(chat["input_ids"] if hasattr(chat, "keys") else chat)
    got, _ = greedy(quantized, [chat], 12)
    logits = PagedRunner(dense, num_blocks=16).prompts([chat + got[0]])[0]
    logp = torch.log_softmax(logits.double(), -1)[len(chat) - 1:-1]  # [12, vocab]: fp32 at each answer position
    gaps = logp.max(-1).values - logp.gather(1, torch.tensor(got[0])[:, None]).squeeze(1)
    print(f"int8-activation chat answer {tokenizer.decode(got[0])!r}, fp32 log-prob gaps {gaps.tolist()}")
    assert gaps.max() <= 0.15


def test_chat_answer_equals_fp32(models, exact_kernels):
    """The headline prompt whose answer torch's bf16 int4 kernel flipped ("Paris" -> "L'Etoile, ...")."""
    tokenizer, quantized, _, dense = models
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                         add_generation_prompt=True, tokenize=True)
    chat = list(chat["input_ids"] if hasattr(chat, "keys") else chat)
    want, _ = greedy(dense, [chat], 12)
    got, _ = greedy(quantized, [chat], 12)
    assert "Paris" in tokenizer.decode(want[0])
    assert got == want, (tokenizer.decode(got[0]), tokenizer.decode(want[0]))


def test_log_likelihood_within_one_percent(models, exact_kernels):
    tokenizer, quantized, _, dense = models
    tokens = tokenizer.encode(TEXT)
    got, want = token_logprobs(quantized, tokens).mean(), token_logprobs(dense, tokens).mean()
    print(f"per-token log-likelihood: 4-bit (exact kernels) {got:.4f}, fp32 {want:.4f}")
    assert abs(got - want) <= 0.001 * abs(want)  # the issue asks 1%; fp32 kernels: equal to 4 decimals


def test_prefill_log_likelihood_within_one_percent_int8_activations(models, int8_act_kernels):
    tokenizer, quantized, _, dense = models
    tokens = tokenizer.encode(TEXT)
    got, want = token_logprobs(quantized, tokens).mean(), token_logprobs(dense, tokens).mean()
    print(f"per-token log-likelihood, one prefill step: 4-bit int8 activations {got:.4f}, fp32 {want:.4f}")
    assert abs(got - want) <= 0.01 * abs(want)
