"""Tensor parallelism on GPUs: Llama-3-8B shape (dummy weights, bf16), TP=1 vs TP=2, one process per config.

    python benchmarks/gpu_tp.py --tp 2 1 --out-dir /tmp/r

Per config: batch-1 decode ms per output token (difference of 1- and 257-token generations after a 512-token
prompt, best of two: the prefill cancels), then the 1000/1000 x ``--prompts`` throughput. TP=1 runs in
process (``uni``); TP=2 through the ``mp`` executor (one worker process per GPU, NCCL). The engine process
itself never touches a GPU. Results: one JSON per config, written as soon as each number exists.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_e2e import LLAMA3_8B, write_config  # noqa: E402


def param_bytes(cfg: dict) -> int:
    h, i, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * i + 2 * h
    return 2 * (L * per_layer + 2 * v * h + h)


def run_config(tp: int, args) -> None:
    from octavo import LLM, SamplingParams

    out = os.path.join(args.out_dir, f"tp{tp}.json")
    res: dict = {"tensor_parallel_size": tp}

    def save():
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
        print(json.dumps(res), flush=True)

    d = write_config(LLAMA3_8B, tempfile.mkdtemp(), "llama3-8b")
    t0 = time.perf_counter()
    llm = LLM(model=d, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, tensor_parallel_size=tp,
              max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=512, max_num_batched_tokens=8192)
    res["start_s"] = time.perf_counter() - t0
    res["kv_blocks_per_rank"] = llm.llm_engine.model_info.num_kv_blocks
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(1000, 120000) for _ in range(512)]}

    def gen(prompts, n):
        t = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True, temperature=0), use_tqdm=False)
        return time.perf_counter() - t, outs

    gen([prompt], 16)  # warm-up
    t1 = min(gen([prompt], 1)[0] for _ in range(2))
    t2 = min(gen([prompt], 257)[0] for _ in range(2))
    per_tok = (t2 - t1) / 256
    weights_per_gpu = param_bytes(LLAMA3_8B) / tp
    res.update({"decode_bs1_ms_per_token": per_tok * 1e3, "weights_GB_per_gpu": weights_per_gpu / 1e9,
                "roofline_ms_at_3TBps": weights_per_gpu / args.copy_rate * 1e3,
                "decode_bs1_fraction_of_roofline": weights_per_gpu / args.copy_rate / per_tok})
    save()
    if args.prompts:
        prompts = [{"prompt_token_ids": [rng.randrange(1000, 120000) for _ in range(1000)]}
                   for _ in range(args.prompts)]
        dt, outs = gen(prompts, 1000)
        total = sum(len(o.outputs[0].token_ids) for o in outs)
        res.update({"throughput_prompts": args.prompts, "throughput_s": dt, "throughput_tok_s": total / dt})
        save()
    llm.llm_engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--copy-rate", type=float, default=3.0e12, help="bytes/s read+written, device copy (H100)")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.one is not None:
        return run_config(args.one, args)
    for tp in args.tp:  # each config in a fresh process: GPU memory and NCCL state start clean
        cmd = [sys.executable, __file__, "--one", str(tp), "--prompts", str(args.prompts), "--copy-rate",
               str(args.copy_rate), "--out-dir", args.out_dir]
        print("config tp", tp, "exit", subprocess.call(cmd), flush=True)


if __name__ == "__main__":
    main()
