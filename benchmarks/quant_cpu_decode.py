"""Batch-1 CPU decode of the embedded SmolLM2 GGUF: 4-bit weights (``gguf`` quantizer) vs fp32 / bf16 dense.

Side by side in one process: each variant is loaded once, then rounds of decode steps alternate between the
variants, so machine noise hits all of them alike; the median step time per variant is reported. Attention is the
engine's CPU default (``cpu_paged``) unless ``--attention torch_sdpa`` (what sessions 3-5 measured).

    python benchmarks/quant_cpu_decode.py [--steps 32] [--rounds 5] [--threads N] [--e2e]

``--e2e`` also times ``LLM.generate`` (batch 1, 64 tokens) per variant. Writes
``benchmarks/results/quant_cpu_decode.json`` with the CPU model, its ISA flags, the date and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

#: name -> (quantization, dtype, int8 activations on decode rows). "gguf-4bit" is the default path (int8
#: activations since session 4, plugins/quant/cpu_int8act.py); "gguf-4bit-fp32act" is OCTAVO_CPU_INT8_ACT=0.
VARIANTS = {"gguf-4bit": (None, torch.float32, True), "gguf-4bit-fp32act": (None, torch.float32, False),
            "fp32": ("none", torch.float32, False), "bf16": ("none", torch.bfloat16, False)}
#: with ``--fused``: the gguf-4bit model whose decode steps run plugins/platforms/cpu_fused_decode.py's one C call
#: (the engine's OCTAVO_CPU_FUSED_DECODE=1 path; the LM head stays the int8 kernel call, as in gguf-4bit)
FUSED = "gguf-4bit-fused"


class _FusedModel:
    """Stands in for the model inside a PagedRunner: single-token decode steps go through the fused runner (the
    step's layout is captured from the backend's build_metadata), everything else through the model."""

    def __init__(self, model, backend_cls) -> None:
        from octavo.plugins.platforms.cpu_fused_decode import CpuFusedDecodeRunner

        self.model, self.backend_cls, self.layout = model, backend_cls, None
        self.fused = CpuFusedDecodeRunner(model, torch.float32)

    def build_metadata(self, layout, device):
        self.layout = layout
        return self.backend_cls.build_metadata(layout, device)

    def __call__(self, input_ids, positions, ctx):
        from types import SimpleNamespace

        hidden = self.fused.maybe_run(SimpleNamespace(input_ids=input_ids, positions=positions, layout=self.layout))
        return hidden if hidden is not None else self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden):
        return self.model.compute_logits(hidden)


def cpu_info() -> dict:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8") if f in flags]
    return {"model": fields.get("Model name", "").strip(), "cpus": os.cpu_count(), "isa": isa,
            "torch": torch.__version__}


def decode_steps(runner, steps: int, key, clock=time.perf_counter) -> float:
    """Seconds per batch-1 decode step over ``steps`` steps (after a 16-token prompt)."""
    runner.free(key)
    runner.step([(key, list(range(100, 116)))])
    start = clock()
    token = 200
    for _ in range(steps):
        token = int(runner.step([(key, [token])])[0][-1].argmax())
    return (clock() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--e2e", action="store_true", help="also time LLM.generate per variant")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time.process_time instead of wall time (a loaded shared machine, --threads 1: time the "
                             "process was descheduled does not count; SMT contention still does)")
    parser.add_argument("--attention", default="cpu_paged",
                        help="attention backend of every variant: cpu_paged (the engine's CPU default, since session 6 "
                             "here) or torch_sdpa (the reference; sessions 3-5 measured with it)")
    parser.add_argument("--fused", action="store_true",
                        help=f"add the variant {FUSED!r}: gguf-4bit with each decode step as one C call over all layers")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "quant_cpu_decode.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("OCTAVO_DISABLE_PROGRESS", "1")

    from octavo.core.loader.resolve import default_model_path
    from octavo.registry import resolve
    from octavo.testing.model import PagedRunner
    from tests.quant.helpers import load

    path = default_model_path()
    runners = {}
    from octavo.plugins.quant import cpu_int8act_ops

    int8_act = cpu_int8act_ops.enabled()  # the process's setting (OCTAVO_CPU_INT8_ACT)
    variants = dict(VARIANTS)
    if args.fused:
        variants[FUSED] = VARIANTS["gguf-4bit"]
    for name, (quantization, dtype, _) in variants.items():
        model, _ = load(path, quantization, dtype=dtype)
        runners[name] = PagedRunner(model, resolve("attention_backends", args.attention), num_blocks=16)
        if name == FUSED:
            shim = _FusedModel(model, runners[name].backend_cls)
            runners[name].model, runners[name].backend_cls = shim, shim
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, runner in runners.items():
            cpu_int8act_ops._state["on"] = int8_act and variants[name][2]
            clock = time.process_time if args.cpu_time else time.perf_counter
            times[name].append(decode_steps(runner, args.steps, ("bench", name), clock))
    cpu_int8act_ops._state["on"] = int8_act
    results = {name: {"ms_per_token": 1e3 * statistics.median(t), "tokens_per_s": 1 / statistics.median(t),
                      "all_ms": [round(1e3 * x, 2) for x in t]} for name, t in times.items()}
    base = results["fp32"]["ms_per_token"]
    for r in results.values():
        r["speedup_vs_fp32"] = base / r["ms_per_token"]
    if args.fused:
        results[FUSED]["fused_steps"] = runners[FUSED].model.fused.num_runs
    record = {"benchmark": f"quant_cpu_decode (model forward, batch 1, {args.attention} attention)", "results": results,
              "int8_activations": int8_act, "clock": "process_time" if args.cpu_time else "perf_counter",
              "cpu": cpu_info(), "threads": torch.get_num_threads(), "python": platform.python_version(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv)}
    if args.e2e:
        record["e2e"] = e2e(path)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
    for name, r in results.items():
        print(f"{name:10s} {r['ms_per_token']:7.2f} ms/token  {r['tokens_per_s']:7.1f} tok/s  "
              f"x{r['speedup_vs_fp32']:.2f} vs fp32")
    print(json.dumps(record["cpu"]), "threads", record["threads"])


def e2e(path: str) -> dict:
    from octavo import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    out = {}
    for name, (quantization, dtype, act8) in VARIANTS.items():
        if not act8 and name.startswith("gguf"):
            continue  # the engine reads OCTAVO_CPU_INT8_ACT itself
        llm = LLM(path, quantization=quantization, dtype=str(dtype).split(".")[-1], max_model_len=512,
                  kv_cache_memory_bytes=1 << 26)
        llm.generate(["Hello"], params, use_tqdm=False)
        start = time.perf_counter()
        llm.generate(["The history of the city begins"], params, use_tqdm=False)
        out[name] = {"tokens_per_s": 64 / (time.perf_counter() - start)}
        del llm
    return out


if __name__ == "__main__":
    main()
