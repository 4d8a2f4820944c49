"""Pipeline parallelism: one batch in flight vs P micro-batches in flight, on one loaded engine (CPU or GPU).

    python benchmarks/pp_microbatch.py --pp 2 --prompts 32 --in-len 64 --out-len 32 --rounds 2 --out /tmp/pp.json

The engine (``mp`` executor, ``pipeline_parallel_size`` stages) is switched while idle between ``depth=1`` (the
engine core finishes a step before it schedules the next: stages take turns) and ``depth=P`` (core/pp_schedule.py;
``--split``: also with the running requests spread evenly over the micro-batches) with ``set_pipeline_depth``;
rounds alternate the order so load drift hits both; the prefix cache is reset before each run. Reports output
tok/s per mode, the ratios of medians, and whether the greedy tokens are identical. Default model: the embedded SmolLM2 as fp32
safetensors (30 layers: 15 per stage at PP=2). On a CPU each stage gets ``cores / P`` threads.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="checkpoint dir (default: embedded SmolLM2, fp32 safetensors)")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--in-len", type=int, default=64)
    ap.add_argument("--out-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--split", action="store_true", help="also P micro-batches with the running requests split "
                    "evenly over them (core/pp_schedule.py)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from octavo import LLM, SamplingParams
    from octavo.core.pp_schedule import set_pipeline_depth

    model = args.model
    if model is None:
        from tests.utils import smollm2_safetensors_dir

        model = str(smollm2_safetensors_dir("float32"))
    t0 = time.perf_counter()
    llm = LLM(model, pipeline_parallel_size=args.pp, dtype=args.dtype, max_model_len=args.in_len + args.out_len + 16,
              kv_cache_memory_bytes=256 << 20, max_num_batched_tokens=args.max_num_batched_tokens,
              max_num_seqs=max(args.prompts, 1), seed=0)
    start_s = time.perf_counter() - t0
    core = llm.llm_engine.core
    rng = random.Random(0)
    vocab = llm.llm_engine.model_info.vocab_size
    prompts = [{"prompt_token_ids": [rng.randrange(100, vocab - 1) for _ in range(args.in_len)]}
               for _ in range(args.prompts)]
    params = SamplingParams(temperature=0, max_tokens=args.out_len, ignore_eos=True)
    modes = ["1", str(args.pp)] + ([f"{args.pp}split"] if args.split else [])
    runs: dict[str, list[float]] = {m: [] for m in modes}
    tokens: dict[str, list] = {}
    for r in range(args.rounds):
        order = modes if r % 2 == 0 else modes[::-1]
        for depth in order:
            set_pipeline_depth(core, int(depth.removesuffix("split")), split=depth.endswith("split"))
            llm.llm_engine.reset_prefix_cache()  # every run prefills in full (same prompts each round)
            t = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            dt = time.perf_counter() - t
            n = sum(len(o.outputs[0].token_ids) for o in outs)
            runs[depth].append(n / dt)
            tokens.setdefault(depth, [list(o.outputs[0].token_ids) for o in outs])
            print(f"round {r} depth {depth}: {n / dt:.1f} tok/s ({dt:.2f} s)", flush=True)
    med = {d: statistics.median(v) for d, v in runs.items()}
    res = {"model": model, "pipeline_parallel_size": args.pp, "workload": f"{args.prompts} x {args.in_len}/"
           f"{args.out_len}", "start_s": start_s, "tok_s": runs,
           "tok_s_median": med, "microbatch_over_one": med[str(args.pp)] / med["1"],
           **({"split_over_one": med[f"{args.pp}split"] / med["1"]} if args.split else {}),
           "tokens_identical": all(tokens[m] == tokens["1"] for m in modes), "cpu_count": os.cpu_count(),
           "loadavg": os.getloadavg()}
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    llm.llm_engine.shutdown()


if __name__ == "__main__":
    main()
