"""LoRA throughput on CPU: SmolLM2-135M (float32), a batch of 64 greedy requests, base model alone vs the same
batch mixed over 8 rank-16 adapters on all seven projections (issue 13's ratio), in one process, side by side.

    .venv/bin/python benchmarks/lora_cpu.py [--rounds 3] [--out benchmarks/results/lora_cpu.json]

Each round runs base and mixed back to back (the order alternates between rounds, so a load that drifts
during the run does not favour one side); ``ratio_median_of_rounds`` is the median of the per-round
mixed/base ratios, ``ratio_mixed_over_base`` best vs best. ``tokens_per_cpu_s`` divides by this process's CPU
time instead of wall time: on a loaded machine (other jobs taking the cores) it moves far less than wall time;
with ``--threads 1`` it is the cleanest number there.

Adapters are written directly as PEFT files (random A/B, safetensors) so the benchmark needs no peft.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

import torch


def write_adapter(path: str, cfg, rank: int, seed: int) -> None:
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    h, inter = cfg.hidden_size, cfg.intermediate_size
    hd = h // cfg.num_attention_heads
    dims = {"q_proj": (h, h), "k_proj": (h, cfg.num_key_value_heads * hd), "v_proj": (h, cfg.num_key_value_heads * hd),
            "o_proj": (h, h), "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}
    tensors = {}
    for layer in range(cfg.num_hidden_layers):
        for name, (d_in, d_out) in dims.items():
            part = "self_attn" if name[0] in "qkvo" else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, d_in, generator=gen) * 0.02
            tensors[f"{key}.lora_B.weight"] = torch.randn(d_out, rank, generator=gen) * 0.02
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(dims)}, f)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers as T

    from octavo import LLM, SamplingParams
    from octavo.lora.request import LoRARequest
    from tests.utils import smollm2_safetensors_dir

    base = str(smollm2_safetensors_dir("float32"))
    cfg = T.AutoConfig.from_pretrained(base)
    tmp = tempfile.mkdtemp(prefix="lora_bench")
    loras = []
    for i in range(args.adapters):
        write_adapter(f"{tmp}/a{i}", cfg, args.rank, seed=i)
        loras.append(LoRARequest(f"a{i}", i + 1, f"{tmp}/a{i}"))
    llm = LLM(base, dtype="float32", enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank,
              max_model_len=256, max_num_seqs=args.batch, kv_cache_memory_bytes=256 << 20, enable_prefix_caching=False)
    prompts = [{"prompt_token_ids": [(17 * i + 3 * j) % 40000 + 100 for j in range(args.prompt_len)]}
               for i in range(args.batch)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    mixed = [loras[i % len(loras)] for i in range(args.batch)]
    warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)  # full batch both ways: adapters loaded,
    for choice in (mixed, None):  # KV pages and allocator warm, so round 0 does not favour the second side
        llm.generate(prompts, warm, use_tqdm=False, lora_request=choice)
    times: dict[str, list[float]] = {"base": [], "mixed": []}
    cpu: dict[str, list[float]] = {"base": [], "mixed": []}  # tokens per CPU-second of this process
    for r in range(args.rounds):
        order = [("base", None), ("mixed", mixed)]
        for name, choice in order if r % 2 == 0 else order[::-1]:
            t0, c0 = time.perf_counter(), time.process_time()
            outs = llm.generate(prompts, params, use_tqdm=False, lora_request=choice)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            n = sum(len(o.outputs[0].token_ids) for o in outs)
            times[name].append(n / dt)
            cpu[name].append(n / dc)
            print(f"round {r} {name}: {times[name][-1]:.1f} tok/s, {cpu[name][-1]:.1f} tok per CPU-s", flush=True)
    llm.llm_engine.shutdown()
    ratios = sorted(m / b for m, b in zip(times["mixed"], times["base"]))
    cpu_ratios = sorted(m / b for m, b in zip(cpu["mixed"], cpu["base"]))
    result = {"machine": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads(),
              "load_average": os.getloadavg(), "args": vars(args), "tokens_per_s": times,
              "ratio_median_of_rounds": ratios[len(ratios) // 2], "ratio_per_round": ratios,
              "ratio_mixed_over_base": max(times["mixed"]) / max(times["base"]),
              "tokens_per_cpu_s": cpu, "cpu_time_ratio_median_of_rounds": cpu_ratios[len(cpu_ratios) // 2],
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
