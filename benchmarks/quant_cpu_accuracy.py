"""Where the 4-bit CPU path of the embedded SmolLM2 GGUF loses accuracy: each numeric factor measured alone.

The 4-bit path differs from the fp32 dequantized path (``quantization="none"``) only in arithmetic, never in
weights (Q4_1 repacks exactly). This script loads both once, then swaps the linear methods of the 4-bit model
for emulations that add ONE rounding at a time to exact fp32 arithmetic on the same weights:

    act-bf16      activations rounded to bf16 before each linear (the tinygemm kernel's input dtype)
    sz-bf16       group scales and zeros rounded to bf16 (the kernel's scales_zeros dtype)
    out-bf16      each linear's output rounded to bf16 (the kernel returns the input dtype)
    head-int8     logits from an int8-per-row copy of the Q8_0 tied embedding (the old gguf head)

and the real kernels (``kernel-*``). Per variant: greedy agreement with fp32 under the same context
(12 prompts x 48 tokens, as tests/quant/test_gguf_smollm2.py), per-token log-likelihood of a fixed text,
mean KL(fp32 || variant) over the teacher-forced positions, and the greedy chat answer to
"What is the capital of France?".

    python benchmarks/quant_cpu_accuracy.py [--variants a,b,...] [--out FILE]

Writes ``benchmarks/results/quant_cpu_accuracy.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

BF16 = torch.bfloat16


def _bf(t: torch.Tensor) -> torch.Tensor:
    return t.to(BF16).float()


class Emulated:
    """A linear method computing in fp32 on the exact dequantized weight, plus the chosen roundings."""

    def __init__(self, act: bool, sz: bool, out: bool) -> None:
        self.act, self.sz, self.out = act, sz, out

    def weight(self, layer) -> torch.Tensor:
        key = ("w", self.sz)
        cache = layer.__dict__.setdefault("_diag_w", {})
        if key not in cache:
            q, s, z = layer._diag_qsz
            s, z = (_bf(s), _bf(z)) if self.sz else (s, z)
            g = q.shape[1] // s.shape[1]
            cache[key] = (q.float() - 8) * s.repeat_interleave(g, 1) + z.repeat_interleave(g, 1)
        return cache[key]

    def apply(self, layer, x, bias=None):
        x2 = _bf(x.float()) if self.act else x.float()
        y = F.linear(x2, self.weight(layer))
        y = _bf(y) if self.out else y
        y = y.to(x.dtype)
        return y + bias if bias is not None else y


class DenseHead:
    """Logits from the head's dequantized weight (fp32, or rounded to ``dtype``) instead of a quantized copy."""

    def __init__(self, dtype=torch.float32) -> None:
        self.dtype = dtype

    def apply(self, layer, x, bias=None):
        w = layer.weight if self.dtype == torch.float32 else layer.__dict__.setdefault(
            "_diag_head", layer.weight.to(self.dtype))
        y = F.linear(x.to(self.dtype), w).float()
        return y + bias if bias is not None else y


def variants(kernel_method, kernel_head, extra: dict) -> dict:
    """name -> (linear method or None for the kernel, head method or None for the kernel's head)."""
    table = {
        "kernel (default)": (None, None),
        "kernel + fp32 head": (None, DenseHead()),
        "emul exact + int8 head": (Emulated(False, False, False), None),
        "emul exact + fp32 head": (Emulated(False, False, False), DenseHead()),
        "emul act-bf16": (Emulated(True, False, False), DenseHead()),
        "emul sz-bf16": (Emulated(False, True, False), DenseHead()),
        "emul out-bf16": (Emulated(False, False, True), DenseHead()),
        "emul act+sz+out bf16": (Emulated(True, True, True), DenseHead()),
        "emul act+sz+out bf16 + int8 head": (Emulated(True, True, True), None),
    }
    table.update(extra)
    return table


def install(model, method, head) -> None:
    from octavo.nn import LinearBase
    from octavo.nn.embedding import ParallelLMHead

    for m in model.modules():
        if isinstance(m, LinearBase) and hasattr(m, "_diag_orig"):
            m.quant_method = method or m._diag_orig
        if isinstance(m, ParallelLMHead):
            m.logits_method = head or m.__dict__.setdefault("_diag_head_orig", m.logits_method)


def keep_qsz():
    """Patch Int4GroupMethod so each layer keeps its canonical fp32 (q, s, z) for the emulations."""
    from octavo.plugins.quant.kernels import Int4GroupMethod

    orig = Int4GroupMethod.process_weights_after_loading

    def patched(self, layer):
        layer._diag_qsz = (layer.qweight.data.clone(), layer.scales.data.clone(), layer.zeros.data.clone())
        layer._diag_orig = self
        orig(self, layer)

    Int4GroupMethod.process_weights_after_loading = patched


def measure(model, dense_results, tokenizer, prompts, text_tokens, chat) -> dict:
    from octavo.testing.model import PagedRunner
    from tests.quant.helpers import greedy, token_logprobs

    want, ref_logits = dense_results["want"], dense_results["logits"]
    runner = PagedRunner(model, num_blocks=64)
    logits = runner.prompts([p + w for p, w in zip(prompts, want)])
    got = [lg[len(p) - 1:-1] for lg, p in zip(logits, prompts)]
    agree = sum(int((g.argmax(-1) == torch.tensor(w)).sum()) for g, w in zip(got, want)) / sum(map(len, want))
    kl = torch.cat([F.kl_div(g.double().log_softmax(-1), r.double().log_softmax(-1), log_target=True,
                             reduction="none").sum(-1) for g, r in zip(got, ref_logits)]).mean()
    ll = float(token_logprobs(model, text_tokens).mean())
    answer, _ = greedy(model, [chat], 16)
    free, _ = greedy(model, prompts, 48)
    same_prefix = sum(next((i for i, (a, b) in enumerate(zip(f, w)) if a != b), len(w)) for f, w in zip(free, want))
    return {"agreement": agree, "kl": float(kl), "log_likelihood": ll,
            "ll_rel_diff": abs(ll - dense_results["ll"]) / abs(dense_results["ll"]),
            "free_run_same_prefix": same_prefix / sum(map(len, want)), "chat_answer": tokenizer.decode(answer[0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="", help="comma-separated subset of variant names")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "quant_cpu_accuracy.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("OCTAVO_DISABLE_PROGRESS", "1")
    from octavo.core.loader.gguf_file import gguf_tokenizer
    from octavo.core.loader.resolve import default_model_path
    from octavo.testing.model import PagedRunner
    from tests.quant.helpers import greedy, load, token_logprobs
    from tests.quant.test_gguf_smollm2 import PROMPTS, TEXT

    path = default_model_path()
    tokenizer = gguf_tokenizer(path)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    text = tokenizer.encode(TEXT)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                         add_generation_prompt=True, tokenize=True)
    chat = list(chat["input_ids"] if isinstance(chat, dict) or hasattr(chat, "keys") else chat)
    dense, _ = load(path, "none")
    want, _ = greedy(dense, prompts, 48)
    ref = PagedRunner(dense, num_blocks=64).prompts([p + w for p, w in zip(prompts, want)])
    dense_results = {"want": want, "logits": [lg[len(p) - 1:-1] for lg, p in zip(ref, prompts)],
                     "ll": float(token_logprobs(dense, text).mean())}
    results = {"fp32 dense": {"log_likelihood": dense_results["ll"],
                              "chat_answer": tokenizer.decode(greedy(dense, [chat], 16)[0][0])}}
    print("fp32 dense", results["fp32 dense"], flush=True)
    del dense
    keep_qsz()
    quantized, _ = load(path, None)
    table = variants(None, None, {})
    wanted = [v for v in args.variants.split(",") if v] or list(table)
    for name in wanted:
        install(quantized, *table[name])
        results[name] = measure(quantized, dense_results, tokenizer, prompts, text, chat)
        print(name, json.dumps(results[name]), flush=True)
    record = {"benchmark": "quant_cpu_accuracy", "results": results,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv)}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
