"""The 8B fp8 + fp8 KV 512 x 1000/1000 run with the last-wave overcommit on vs off, in ONE engine (issue 9's 1.6x).

On an H100 the fp8 cache holds ~490 of the 512 requests at their final length: the projected admission
(core/kv_admission.py) then runs the last ~20 as a second wave of ~1,000 small steps. ``kv_admission_overcommit``
lets them start with the others when the whole rest of the queue fits in that share of the cache (a few are
recomputed at the end). Here the engine is built exactly as benchmarks/gpu_e2e.py's ``decode_bs1 --throughput
--max-num-seqs 512`` builds it (dummy weights, fp8 weights + fp8 KV cache, gpu_memory_utilization 0.9, CUDA graphs,
async scheduling), warmed as it warms, then the timed run is repeated with the scheduler's overcommit switched
between runs (``--order``, e.g. ``on,off``): fresh random prompts each run (prefix caching cannot serve one run
from another). Per run: seconds, output tok/s, steps, preemptions, prompt tokens computed (recomputes included).

    OCTAVO_QUANTIZATION=fp8 OCTAVO_KV_CACHE_DTYPE=fp8 python benchmarks/fp8_tail_ab.py --out /tmp/tail.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T0 = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--order", default="on,off", help="comma-separated on/off: the timed runs, in this order")
    ap.add_argument("--overcommit", type=float, default=0.05, help="the share used by 'on' runs")
    ap.add_argument("--knob", choices=["overcommit", "pacing"], default="overcommit",
                    help="what on/off switches: the overcommit share, or admission pacing (on: auto, core/kv_pacing.py)")
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--budget", type=float, default=1e9, help="start no timed run after this many seconds")
    args = ap.parse_args()
    import torch

    from benchmarks.gpu_e2e import LLAMA3_8B, make_llm, warm_up, write_config
    from octavo import SamplingParams

    res = {"card": torch.cuda.get_device_name(), "torch": torch.__version__,
           "quantization": os.environ.get("OCTAVO_QUANTIZATION"), "kv_cache_dtype": os.environ.get("OCTAVO_KV_CACHE_DTYPE"),
           "command": "python " + " ".join(sys.argv), "runs": []}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    d = write_config(LLAMA3_8B, tempfile.mkdtemp(), "llama3-8b")
    llm, worker, _ = make_llm(d, max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=512,
                              max_num_batched_tokens=8192)
    sched = llm.llm_engine.core.scheduler
    adm = sched.admission
    res.update(kv_blocks=worker.num_blocks, max_blocks=adm.max_blocks, overcommit_blocks_default=adm.overcommit_blocks,
               load_s=time.perf_counter() - T0)
    print("built", json.dumps({k: res[k] for k in ("kv_blocks", "max_blocks", "overcommit_blocks_default")}), flush=True)
    # gpu_e2e's warm-up: 64 prompts of 1000 tokens with 1-32 outputs, then lone short prefills
    res["warmup_s"] = warm_up(llm, [(1000, 1 + i % 32) for i in range(64)], seed=11)
    for n in (2, 3, 5):
        res["warmup_s"] += warm_up(llm, [(n, 1)], seed=12 + n)
    save()
    for i, mode in enumerate(args.order.split(",")):
        if time.perf_counter() - T0 > args.budget:
            res["runs"].append({"mode": mode, "skipped": "budget"})
            break
        if args.knob == "pacing":  # a new episode (and rate) at the run's first check
            adm.pacer.setting, adm.pacer.rate = ("auto" if mode == "on" else "off"), None
        else:
            adm.overcommit_blocks = int(args.overcommit * adm.max_blocks) if mode == "on" else 0
        rng = random.Random(100 + i)
        prompts = [{"prompt_token_ids": [rng.randrange(1000, 120000) for _ in range(1000)]}
                   for _ in range(args.prompts)]
        before = llm.llm_engine.get_stats()
        torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(max_tokens=1000, ignore_eos=True), use_tqdm=False)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        after = llm.llm_engine.get_stats()
        total = sum(len(o.outputs[0].token_ids) for o in outs)
        run = {"mode": mode, "knob": args.knob, "overcommit_blocks": adm.overcommit_blocks,
               "pacing_rates": list(adm.pacer.episodes), "s": dt, "output_tokens": total,
               "tok_s": total / dt, **{k: getattr(after, k) - getattr(before, k)
                                       for k in ("num_steps", "num_preemptions", "num_prompt_tokens")}}
        res["runs"].append(run)
        print("run", json.dumps(run), flush=True)
        save()
    res["seconds"] = time.perf_counter() - T0
    save()
    print(f"done in {res['seconds']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
