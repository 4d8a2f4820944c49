"""Issue 16 on a GPU: what LLM.sleep gives back, measured (torch allocator + the device's own free memory),
and that greedy output after wake_up equals the output before. Also: sleep refused while CUDA graphs are
captured (enforce_eager=False). Prints one JSON object; --device cpu for a dry run.

    python benchmarks/device/surface_sleep.py [--model PATH_OR_NONE] [--device cuda] [--out result.json]
"""
import argparse
import json
import time

import torch

from octavo import LLM, SamplingParams


def used(device: str) -> dict:
    if device != "cuda":
        import psutil

        return {"rss_mib": psutil.Process().memory_info().rss / 2**20}
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {"allocated_mib": torch.cuda.memory_allocated() / 2**20, "reserved_mib": torch.cuda.memory_reserved() / 2**20,
            "device_used_mib": (total - free) / 2**20}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None)
    p.add_argument("--tiny", action="store_true", help="a 2-layer shape instead of ~1B (CPU dry run)")
    args = p.parse_args()
    kw = dict(enable_sleep_mode=True, max_model_len=1024)
    if args.model is None:  # a ~1B Llama shape, dummy weights: enough bytes to see
        kw.update(model="/tmp/surface_llama1b", load_format="dummy")
        from transformers import LlamaConfig

        size = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2) if args.tiny else \
            dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16)
        LlamaConfig(**size, num_attention_heads=16,
                    num_key_value_heads=4, vocab_size=32000, architectures=["LlamaForCausalLM"],
                    max_position_embeddings=2048).save_pretrained(kw["model"])
        kw["skip_tokenizer_init"] = True
    else:
        kw["model"] = args.model
    if args.device != "cuda":
        kw["kv_cache_memory_bytes"] = 256 << 20
    prompts = [{"prompt_token_ids": [1, 450, 7483, 310, 3444, 338]}] * 4
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    report: dict = {"device": args.device, "model": kw["model"]}
    if args.device == "cuda":
        graphs = LLM(**kw)
        try:
            graphs.sleep(1)
            report["sleep_with_cuda_graphs"] = "accepted (unexpected)"
        except ValueError as e:
            report["sleep_with_cuda_graphs"] = f"refused: {str(e)[:100]}"
        graphs.llm_engine.shutdown()
        del graphs
        torch.cuda.empty_cache()
    llm = LLM(enforce_eager=True, **kw)
    before = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    report["awake"] = used(args.device)
    for level in (1, 2):
        t0 = time.perf_counter()
        freed = llm.sleep(level)
        report[f"sleep{level}_s"] = round(time.perf_counter() - t0, 3)
        report[f"sleep{level}_freed_mib"] = {k: round(v / 2**20, 1) for k, v in freed.items()}
        report[f"asleep{level}"] = used(args.device)
        t0 = time.perf_counter()
        llm.wake_up()
        report[f"wake{level}_s"] = round(time.perf_counter() - t0, 3)
        report[f"woke{level}"] = used(args.device)
        after = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
        report[f"tokens_equal_after_level{level}"] = after == before
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
