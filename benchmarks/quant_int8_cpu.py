"""CPU decode step time of the 8-bit formats vs fp32 on a SmolLM2-135M-shaped model (random weights).

Variants, each loaded once, then rounds of decode steps alternate between them in one process (machine noise
hits all alike; the median per variant is reported):

- ``fp32``: the dense checkpoint holding the dequantized W8A8 weights (the reference the tests compare to);
- ``ct-w8a8``: compressed-tensors INT8 W8A8 (int8 weights per row, dynamic per-token int8 activations,
  ``torch._int_mm``);
- ``gptq8-g64``: GPTQ 8-bit, groups of 64, asymmetric (octavo's fp32 int8 kernel + zero term);
- ``int8``: the dense checkpoint quantized at load to int8 per row (octavo's fp32 int8 kernel).

    python benchmarks/quant_int8_cpu.py [--steps 16] [--rounds 3] [--threads N] [--batch 1 8]

Writes ``benchmarks/results/quant_int8_cpu.json`` (CPU model and ISA flags, threads, date, command).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def build(root: str) -> dict[str, tuple[str, str | None]]:
    """Write the checkpoints; variant -> (path, quantization setting)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.quant.formats import write_checkpoints
    from tests.quant.formats_int8 import ct_w8a8_tensors, gptq8_tensors, w8a8_config

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn_like(p) * 0.04)
    w8a8, dense = write_checkpoints(model, root, "ct-w8a8", w8a8_config(), lambda w, i: ct_w8a8_tensors(w))
    gptq_cfg = {"quant_method": "gptq", "bits": 8, "group_size": 64, "sym": False, "desc_act": False}
    gptq, _ = write_checkpoints(model, root, "gptq8", gptq_cfg, lambda w, i: gptq8_tensors(w, 64, False, False))
    return {"fp32": (dense, None), "ct-w8a8": (w8a8, None), "gptq8-g64": (gptq, None), "int8": (dense, "int8")}


def decode_steps(runner, steps: int, batch: int, tag) -> float:
    """Seconds per decode step of ``batch`` sequences (after 16-token prompts)."""
    keys = [(tag, i) for i in range(batch)]
    for key in keys:
        runner.free(key)
    runner.step([(key, list(range(100 + i, 116 + i))) for i, key in enumerate(keys)])
    start = time.perf_counter()
    tokens = [200] * batch
    for _ in range(steps):
        logits = runner.step([(key, [t]) for key, t in zip(keys, tokens)])
        tokens = [int(lg[-1].argmax()) for lg in logits]
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "quant_int8_cpu.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("OCTAVO_DISABLE_PROGRESS", "1")
    from benchmarks.quant_cpu_decode import cpu_info
    from octavo.testing.model import PagedRunner
    from tests.quant.helpers import load

    with tempfile.TemporaryDirectory() as root:
        variants = build(root)
        runners = {name: PagedRunner(load(path, quant)[0], num_blocks=8 * max(args.batch) + 8)
                   for name, (path, quant) in variants.items()}
    results = {}
    for batch in args.batch:
        times: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.rounds):
            for name, runner in runners.items():
                times[name].append(decode_steps(runner, args.steps, batch, name))
        res = {name: {"ms_per_step": 1e3 * statistics.median(t), "all_ms": [round(1e3 * x, 2) for x in t]}
               for name, t in times.items()}
        for r in res.values():
            r["speedup_vs_fp32"] = res["fp32"]["ms_per_step"] / r["ms_per_step"]
        results[f"batch_{batch}"] = res
        for name, r in res.items():
            print(f"batch {batch:3d} {name:11s} {r['ms_per_step']:8.2f} ms/step  x{r['speedup_vs_fp32']:.2f} vs fp32",
                  flush=True)
    record = {"benchmark": "quant_int8_cpu (SmolLM2-135M shape, random weights, model forward, reference attention)",
              "results": results, "cpu": cpu_info(), "threads": torch.get_num_threads(),
              "load_avg": os.getloadavg(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv)}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
    print(json.dumps(record["cpu"]), "threads", record["threads"], "load", record["load_avg"])


if __name__ == "__main__":
    main()
