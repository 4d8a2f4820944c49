"""Which Triton kernels build INSIDE the timed 512 x 1000/1000 run of ``gpu_e2e.py decode_bs1 --throughput``, and why
(issue 9: session 7's fp8 e2e built two ``_paged_attention_kernel`` variants in its timed region, 1.8 s of 49.6 s;
the bf16 run one decode and one paged variant, 1.1 s).

The real run needs the 8B engine (~50-70 s); the kernels' specializations depend on the attention shape (heads,
head size, cache dtype) and on the schedule (rows per step, prefill chunks next to decodes), not on the layer count.
So this builds the Llama-3-8B shape with ``--layers`` layers (default 2) and ``num_gpu_blocks_override`` set to the
real run's block count (59,602 fp8 / 26,420 bf16 on an H100 at gpu_memory_utilization 0.9), runs gpu_e2e's own
warm-up, then the same 512 x 1000/1000 timed workload, and logs every build with its specialization key (the
argument signature Triton specializes on: integer == 1 / multiple of 16, pointer alignment, constexprs).

    python benchmarks/fp8_jit_probe.py --variant fp8 --out /tmp/probe.json [--warm extra]

``--warm extra`` adds a second warm-up pass shaped like the timed run's first mixed steps (decode rows of the
full batch next to prefill chunks) to show whether that shape is what the warm-up misses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.gpu_e2e import LLAMA3_8B, gen_timed, make_llm, warm_up, write_config  # noqa: E402

BLOCKS = {"fp8": 59602, "bf16": 26420}  # the real 8B runs' KV blocks (session 7 batch 2, H100 80GB HBM3)


class KeyedJitMisses:
    """Like gpu_e2e.JitMisses, but keeps each build's specialization key (truncated) as well as its name."""

    def __init__(self) -> None:
        import triton.runtime.jit as jit

        self.log: list[dict] = []
        orig = jit.JITFunction._do_compile
        log = self.log

        def counted(fn_self, *a, **k):
            t = time.perf_counter()
            try:
                return orig(fn_self, *a, **k)
            finally:
                log.append({"name": getattr(fn_self, "__name__", "?"), "s": round(time.perf_counter() - t, 3),
                            "key": repr(a[0])[:900] if a else repr(sorted(k))[:300],
                            "rest": repr(a[1:4])[:900]})
                # printed as it happens: a run cut by its time slot still shows what it built
                print(f"BUILD {len(log)} {log[-1]['name']} {log[-1]['s']}s {log[-1]['key'][:300]}", flush=True)

        jit.JITFunction._do_compile = counted


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=sorted(BLOCKS), default="fp8")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--warm", choices=["e2e", "extra"], default="e2e")
    ap.add_argument("--in-len", type=int, default=1000, help="CPU dry runs only: the real run is 1000")
    ap.add_argument("--out-len", type=int, default=1000, help="CPU dry runs only: the real run is 1000")
    ap.add_argument("--blocks", type=int, default=0, help="KV blocks (default: the real run's for --variant)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import random

    from octavo import SamplingParams

    if args.variant == "fp8":
        os.environ["OCTAVO_QUANTIZATION"] = "fp8"
        os.environ["OCTAVO_KV_CACHE_DTYPE"] = "fp8"
    import torch

    if not torch.cuda.is_available():  # a CPU dry run of this script (gen_timed synchronizes the GPU)
        torch.cuda.synchronize = lambda *a: None
    jit = KeyedJitMisses()
    blocks = args.blocks or BLOCKS[args.variant]
    res: dict = {"variant": args.variant, "layers": args.layers, "blocks": blocks, "warm": args.warm,
                 "in_len": args.in_len, "out_len": args.out_len, "prompts": args.prompts}
    with tempfile.TemporaryDirectory() as tmp:
        d = write_config(dict(LLAMA3_8B, num_hidden_layers=args.layers), tmp, "llama3-8b-probe")
        t0 = time.perf_counter()
        llm, worker, _ = make_llm(d, max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=512,
                                  max_num_batched_tokens=8192, num_gpu_blocks_override=blocks)
        res["build_s"] = round(time.perf_counter() - t0, 2)
        res["builds_at_start"] = len(jit.log)
        if torch.cuda.is_available():  # where the device memory went (the KV cache gets what the rest leaves of 0.9)
            free, total = torch.cuda.mem_get_info()
            gib = 2 ** 30
            weights = sum(p.numel() * p.element_size() for p in worker.model.parameters())
            kv = sum(t.numel() * t.element_size() for t in worker.kv_caches)
            res["memory_GiB"] = {"total": total / gib, "used": (total - free) / gib, "weights": weights / gib,
                                 "kv_cache": kv / gib, "torch_allocated": torch.cuda.memory_allocated() / gib,
                                 "torch_reserved": torch.cuda.memory_reserved() / gib,
                                 "torch_peak_allocated": torch.cuda.max_memory_allocated() / gib,
                                 "not_torch": (total - free - torch.cuda.memory_reserved()) / gib}
            print("memory", json.dumps(res["memory_GiB"]), flush=True)
        num, in_len, out_len = args.prompts, args.in_len, args.out_len
        t = time.perf_counter()
        warm_up(llm, [(in_len, 1 + i % 32) for i in range(min(num, 64))], seed=11)
        if args.warm == "extra":  # the timed run's first steps: every row decoding next to 8192-token chunks
            warm_up(llm, [(in_len, 40 + i % 24) for i in range(num)], seed=12)
        res["warm_s"] = round(time.perf_counter() - t, 2)
        mark = len(jit.log)
        print(f"TIMED RUN STARTS after {mark} builds", flush=True)
        res["builds_in_warmup"] = [e["name"] for e in jit.log[res["builds_at_start"]:mark]]
        rng = random.Random(0)
        prompts = [{"prompt_token_ids": [rng.randrange(1000, 120000) for _ in range(in_len)]} for _ in range(num)]
        before = llm.llm_engine.get_stats()
        dt, outs = gen_timed(llm, prompts, SamplingParams(max_tokens=out_len, ignore_eos=True))
        after = llm.llm_engine.get_stats()
        res.update({"timed_s": round(dt, 2), "steps": after.num_steps - before.num_steps,
                    "preemptions": after.num_preemptions - before.num_preemptions,
                    "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                    "builds_in_timed_run": jit.log[mark:]})
        print(json.dumps({k: v for k, v in res.items() if k != "builds_in_timed_run"}), flush=True)
        for e in jit.log[mark:]:
            print("TIMED BUILD", e["name"], e["s"], "s", e["key"][:400], flush=True)
        if torch.cuda.is_available():  # last (it unbinds the layers' caches): the sizing pass's activation peak
            from octavo.core.profiling import profile_run

            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            profile_run(worker)
            res["profile_run_peak_GiB"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
            print("profile_run peak above the engine's tensors", res["profile_run_peak_GiB"], "GiB", flush=True)
        llm.llm_engine.shutdown()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
