"""Where the device memory of the 8B e2e engine goes, and whether its KV sizing leaves enough for the run (issue 9).

    python benchmarks/kv_sizing_probe.py --variant fp8 --out /tmp/kv_fp8.json     (bf16 | fp8 = fp8 weights + KV)

Builds the engine exactly as ``benchmarks/gpu_e2e.py decode_bs1 --max-num-seqs 512`` does (Llama-3-8B shape, dummy
weights, max_model_len 4096, gpu_memory_utilization 0.9, 8192-token steps, CUDA graphs), records the sizing pass's
readings (``worker.kv_sizing``, core/profiling.py), the KV blocks and the graph pool, then runs the step shapes that
need the most activation memory: gpu_e2e's warm-up (64 x 1000-token prompts: 8192-token prefill chunks next to
decode rows) and 512 short prompts decoding together (512-row steps: the graph at 512 and the sampler's 512 x vocab
rows, default temperature 1). An OOM fails the run (exit code, traceback in the log); the JSON has the allocator's
peak reservation and the device's free memory after each phase. CPU dry run: ``--dry`` checks the arguments only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=["bf16", "fp8"], required=True)
    ap.add_argument("--short-prompts", type=int, default=512)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry", action="store_true", help="parse and exit (CPU check of the script)")
    args = ap.parse_args()
    if args.dry:
        print("dry run ok", args)
        return
    if args.variant == "fp8":
        os.environ["OCTAVO_QUANTIZATION"] = "fp8"
        os.environ["OCTAVO_KV_CACHE_DTYPE"] = "fp8"
    import torch
    from gpu_e2e import LLAMA3_8B, gen_timed, make_llm, warm_up, write_config

    from octavo import SamplingParams

    gib = 2 ** 30

    def reading(tag: str) -> dict:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        r = {"used": (total - free) / gib, "free": free / gib, "of_total": (total - free) / total,
             "torch_allocated": torch.cuda.memory_allocated() / gib,
             "torch_reserved": torch.cuda.memory_reserved() / gib,
             "torch_peak_reserved": torch.cuda.max_memory_reserved() / gib,
             "torch_peak_allocated": torch.cuda.max_memory_allocated() / gib}
        print(tag, json.dumps({k: round(v, 3) for k, v in r.items()}), flush=True)
        return r

    res: dict = {"variant": args.variant, "card": torch.cuda.get_device_name(0), "phases": {}}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            d = write_config(LLAMA3_8B, tmp, "llama3-8b")
            t = time.perf_counter()
            llm, worker, _info = make_llm(d, max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=512,
                                          max_num_batched_tokens=8192)
            res["start_s"] = round(time.perf_counter() - t, 1)
            gr = worker.runner.graph_runner
            res.update({"kv_blocks": worker.num_blocks, "kv_sizing": worker.kv_sizing,
                        "kv_cache_GiB": sum(x.numel() * x.element_size() for x in worker.kv_caches) / gib,
                        "weights_GiB": sum(p.numel() * p.element_size() for p in worker.model.parameters()) / gib,
                        "graph_capture_MiB": gr.capture_bytes / 2**20 if gr else None})
            print("sizing", json.dumps(res, default=str), flush=True)
            res["phases"]["built"] = reading("built")
            torch.cuda.reset_peak_memory_stats()
            res["warm_s"] = round(warm_up(llm, [(1000, 1 + i % 32) for i in range(64)], seed=11), 2)
            res["phases"]["e2e_warm_up"] = reading("e2e_warm_up")
            rng = random.Random(5)
            prompts = [{"prompt_token_ids": [rng.randrange(1000, 120000) for _ in range(100 + i % 29)]}
                       for i in range(args.short_prompts)]
            torch.cuda.reset_peak_memory_stats()
            dt, outs = gen_timed(llm, prompts, SamplingParams(max_tokens=24, ignore_eos=True))
            res["rows_512_s"] = round(dt, 2)
            res["rows_512_tokens"] = sum(len(o.outputs[0].token_ids) for o in outs)
            res["phases"]["rows_512"] = reading("rows_512")
            res["ok"] = True
            llm.llm_engine.shutdown()
    except Exception as e:  # noqa: BLE001 - the record says what failed (an OOM is the point of the probe)
        res["ok"] = False
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
        print("FAILED", res["error"], flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(json.dumps(res, default=str), flush=True)
    sys.exit(0 if res.get("ok") else 1)


if __name__ == "__main__":
    main()
