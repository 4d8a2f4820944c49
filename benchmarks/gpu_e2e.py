"""End-to-end GPU benchmarks and parity checks, each task in its own process, the transformers peer on the
same card in the same call. Results: one JSON per task under ``--out-dir`` and a merged record.

    python benchmarks/gpu_e2e.py parity decode_bs1 qwen3_nanovllm tf_qwen3_nanovllm --out-dir /tmp/r

Tasks:
  parity            greedy tokens and logprobs of octavo (bf16, triton, CUDA graphs) vs transformers on small
                    random-weight Llama (and Qwen3 when octavo registers it) checkpoints built here
  decode_bs1        Llama-3-8B shape, dummy weights, bf16: ms per output token at batch 1 vs the roofline
                    (bytes a step reads / measured copy bandwidth); then the 1000/1000 x 512 throughput
                    (``--throughput``) in the same process
  tf_decode_bs1     the same batch-1 decode through transformers ``generate``
  qwen3_nanovllm    nano-vllm's workload on a Qwen3-0.6B shape: 256 requests, in/out lengths U[100, 1024]
  tf_qwen3_nanovllm the first ``--tf-requests`` requests of that workload through batched transformers generate
  tf_8b_throughput  transformers batched generate on the Llama-3-8B shape (64 prompts x 1000 tokens)
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests.gpu.parity
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its helpers, also when imported as benchmarks.gpu_e2e

# The shared helpers and the transformers tasks live beside this file; every name still imports from here.
from gpu_e2e_common import (  # noqa: E402, F401 - re-exported for the other GPU benchmarks
    LLAMA3_8B,
    QWEN3_0P6B,
    JitMisses,
    copy_bandwidth,
    gen_timed,
    make_llm,
    nanovllm_workload,
    qwen3_config,
    warm_up,
    write_config,
)
from gpu_e2e_tf import _tf_batched, task_tf_8b_throughput, task_tf_decode_bs1, task_tf_qwen3_nanovllm  # noqa: E402, F401


# ------------------------------------------------------------------------------------------------ tasks
def task_decode_bs1(args, tmp) -> dict:
    import torch

    from octavo import SamplingParams

    jit = JitMisses()
    bw = copy_bandwidth()
    torch.cuda.empty_cache()
    d = write_config(LLAMA3_8B, tmp, "llama3-8b")
    t0 = time.perf_counter()
    llm, worker, info = make_llm(d, max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=args.max_num_seqs,
                                 max_num_batched_tokens=args.max_num_batched_tokens)
    load_s = time.perf_counter() - t0
    weight_bytes = sum(p.numel() * p.element_size() for p in worker.model.parameters())
    embed_bytes = worker.model.model.embed_tokens.weight.numel() * 2
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(1000, 120000) for _ in range(512)]}
    n = 256
    gen_timed(llm, [prompt], SamplingParams(max_tokens=16, ignore_eos=True))  # warm-up

    gens: dict = {}  # every timed generation's ms (diagnostic: each carries one prefill step of 26-47 ms on the H200)

    def best(tokens, llm=llm):  # best of two generations of the same prompt
        ts = [gen_timed(llm, [prompt], SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0))[0]
              for _ in range(2)]
        gens[str(tokens)] = [round(t * 1e3, 2) for t in ts]
        return min(ts)

    # per token = difference of generations of 1, 257 and 513 tokens (the prefill cancels): the headline is
    # the mean over tokens 2..513 (contexts 513..1024), the halves show the spread
    t1, t2, t3 = best(1), best(n + 1), best(2 * n + 1)
    per_tok = (t3 - t1) / (2 * n)
    windows = {"ms_per_token_ctx_513_768": (t2 - t1) / n * 1e3, "ms_per_token_ctx_769_1024": (t3 - t2) / n * 1e3}
    kv_per_tok = 32 * 8 * 128 * 2 * 2
    kv_bytes = (512 + n) * kv_per_tok  # mean context over the timed tokens
    roof = (weight_bytes + kv_bytes) / bw
    roof_strict = (weight_bytes - embed_bytes + kv_bytes) / bw
    # issue 9's strict key (session 11): the bytes a step reads, KV in the cache's own element size (fp8: 1 byte)
    kv_elem = torch.empty((), dtype=worker._kv_dtype()).element_size()
    roof_read = (weight_bytes - embed_bytes + (512 + n) * kv_per_tok // 2 * kv_elem) / bw
    gr = worker.runner.graph_runner
    res = {"copy_bandwidth_TBps": bw / 1e12, "weights_GB": weight_bytes / 1e9, "load_s": load_s,
           "fused": info.get("fused"), "graph_sizes": len(info.get("graph_sizes") or []),
           "graph_replays": gr.num_replays if gr else 0, "kv_blocks": worker.num_blocks,
           "kv_sizing": getattr(worker, "kv_sizing", None),  # the sizing pass's device readings (core/profiling.py)
           "graph_capture_s": gr.capture_seconds if gr else None,
           "graph_capture_MiB": gr.capture_bytes / 2**20 if gr else None,
           "decode_ms_per_token": per_tok * 1e3, **windows, "generation_ms": gens, "roofline_ms": roof * 1e3,
           "decode_bs1_fraction_of_roofline": roof / per_tok,
           "fraction_of_roofline_excluding_embedding_table": roof_strict / per_tok,
           "decode_bs1_strict_fraction_of_roofline": roof_read / per_tok, "strict_roofline_ms": roof_read * 1e3}
    if gr is not None and 1 in gr.graphs:  # GPU time of the captured forward alone (no host work between)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(50):
            gr.graphs[1].replay()
        torch.cuda.synchronize()
        res["graph_forward_ms"] = (time.perf_counter() - t) / 50 * 1e3
        res["host_gap_ms_per_token"] = res["decode_ms_per_token"] - res["graph_forward_ms"]
    print(json.dumps(res), flush=True)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            gen_timed(llm, [prompt], SamplingParams(max_tokens=8, ignore_eos=True))
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
        res["profile_top"] = table
        print(table, flush=True)
    if args.throughput:
        num, in_len, out_len = args.tp_prompts, 1000, 1000
        prompts = [{"prompt_token_ids": [rng.randrange(1000, 120000) for _ in range(in_len)]} for _ in range(num)]
        # warm-up: 64 prompts of the same length (8 full prefill chunks of 8192, mixed steps), outputs of 1-32
        # tokens; decode batches above 64 replay graphs captured (and their kernels compiled) at start
        res["throughput_warmup_s"] = warm_up(llm, [(in_len, 1 + i % 32) for i in range(min(num, 64))], seed=11)
        # + lone prefills of 2, 3 and 5 tokens: a step whose only prefill piece is a short prompt tail tiles the
        # general attention kernel by its length (BLOCK_Q 2 / 4 / 8), a variant the 1000-token warm-up never builds
        # (suspected for session 7's two builds inside the timed fp8 run; the keys below say which were missed)
        for n in (2, 3, 5):
            res["throughput_warmup_s"] += warm_up(llm, [(n, 1)], seed=12 + n)
        res["warmed"] = True
        before, mark = llm.llm_engine.get_stats(), len(jit.log)
        dt, outs = gen_timed(llm, prompts, SamplingParams(max_tokens=out_len, ignore_eos=True))
        res["throughput_triton_builds_in_timed_run"] = jit.since(mark)
        res["throughput_triton_build_keys_in_timed_run"] = jit.keys_since(mark)  # which specialization was missed
        total = sum(len(o.outputs[0].token_ids) for o in outs)
        after = llm.llm_engine.get_stats()  # the schedule: steps, preemptions, prompt tokens computed (recomputes)
        free, dev_total = torch.cuda.mem_get_info()  # what the run left of the device (the sizing's margin)
        res["throughput_memory_GiB"] = {"peak_torch_reserved": torch.cuda.max_memory_reserved() / 2**30,
                                        "free_after": free / 2**30, "total": dev_total / 2**30}
        res.update({"throughput_prompts": num, "throughput_s": dt, "throughput_output_tokens": total,
                    "throughput_8b_1000_1000_tok_s": total / dt,
                    "kv_admission": llm.llm_engine.core.settings.scheduler.kv_admission,
                    **{f"throughput_{k}": getattr(after, k) - getattr(before, k)
                       for k in ("num_steps", "num_preemptions", "num_prompt_tokens")}})
        print(json.dumps({k: res[k] for k in res if k.startswith("throughput")}), flush=True)
    del llm
    torch.cuda.empty_cache()
    return res


def task_qwen3_nanovllm(args, tmp) -> dict:
    from octavo import SamplingParams

    cfg, arch = qwen3_config()
    d = write_config(cfg, tmp, "qwen3-0.6b")
    jit = JitMisses()
    llm, worker, info = make_llm(d, max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=args.max_num_seqs,
                                 max_num_batched_tokens=args.max_num_batched_tokens)
    reqs = nanovllm_workload()
    # warm-up: every request's prompt length (the timed run's prefill chunks), outputs of 1-32 tokens
    warm_s = warm_up(llm, [(len(ids), 1 + i % 32) for i, (ids, _) in enumerate(reqs)], seed=11, temperature=0.6)
    prompts = [{"prompt_token_ids": ids} for ids, _ in reqs]
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.6) for _, n in reqs]
    mark = len(jit.log)
    dt, outs = gen_timed(llm, prompts, params)
    total = sum(len(o.outputs[0].token_ids) for o in outs)
    res = {"architecture": arch, "triton_builds_in_timed_run": jit.since(mark),
           "triton_build_keys_in_timed_run": jit.keys_since(mark), "requests": len(reqs), "output_tokens": total, "seconds": dt,
           "throughput_qwen3_0p6b_nanovllm_tok_s": total / dt, "warmed": True, "warmup_s": warm_s,
           "kv_blocks": worker.num_blocks,
           "fused": info.get("fused"), "graph_replays": worker.runner.graph_runner.num_replays
           if worker.runner.graph_runner else 0}
    print(json.dumps(res), flush=True)
    if args.cprofile:  # where the host time of a decode-heavy run goes (profiled run, not timed)
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        llm.generate(prompts[:128], [SamplingParams(max_tokens=200, ignore_eos=True, temperature=0.6)] * 128,
                     use_tqdm=False)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
        res["cprofile_top_tottime"] = buf.getvalue()
        print(buf.getvalue(), flush=True)
    return res


def task_bs1_host_diag(args, tmp) -> dict:
    """Batch-1 host gap vs context on the small Qwen3 shape: per-token time per window, with and without the
    cyclic GC, and a cProfile of decode steps at a long context."""
    import cProfile
    import gc
    import io
    import pstats

    import torch

    from octavo import SamplingParams

    cfg, arch = qwen3_config()
    d = write_config(cfg, tmp, "qwen3-0.6b")
    llm, worker, info = make_llm(d, max_model_len=4096, gpu_memory_utilization=0.5, max_num_seqs=8)
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(1000, 100000) for _ in range(128)]}
    gr = worker.runner.graph_runner

    def t(n):
        return min(gen_timed(llm, [prompt], SamplingParams(max_tokens=n, ignore_eos=True, temperature=0))[0]
                   for _ in range(2))

    t(16)
    res = {"architecture": arch}
    for gc_on in (True, False):
        (gc.enable if gc_on else gc.disable)()
        ts = {n: t(n) for n in (1, 129, 513, 1025, 2049)}
        res[f"gc_{gc_on}"] = {f"{a}->{b}": (ts[b] - ts[a]) / (b - a) * 1e3 for a, b in
                              ((1, 129), (129, 513), (513, 1025), (1025, 2049))}
    gc.enable()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        gr.graphs[1].replay()
    torch.cuda.synchronize()
    res["graph_forward_ms"] = (time.perf_counter() - t0) / 50 * 1e3
    for n in (257, 2049):
        prof = cProfile.Profile()
        prof.enable()
        llm.generate([prompt], SamplingParams(max_tokens=n, ignore_eos=True, temperature=0), use_tqdm=False)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
        res[f"cprofile_{n}"] = buf.getvalue()
    print(json.dumps({k: v for k, v in res.items() if not k.startswith("cprofile")}, indent=1), flush=True)
    print(res["cprofile_257"], res["cprofile_2049"], flush=True)
    return res


def task_parity(args, tmp) -> dict:
    from tests.gpu.parity import run_parity

    return run_parity(tmp)


TASKS = {name[5:]: fn for name, fn in globals().items() if name.startswith("task_")}


def merge_record(out_dir: str, command: str, commit: str | None = None, card: str | None = None) -> dict:
    """One ``{"card", "date", "command", "commit", "results"}`` record from the task JSONs in ``out_dir``,
    with the headline keys of docs/performance.md computed from them."""
    import datetime

    results = {}
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".json") and name[:-5] in TASKS:
            with open(os.path.join(out_dir, name)) as f:
                results[name[:-5]] = json.load(f)
    head = {}
    d, q = results.get("decode_bs1", {}), results.get("qwen3_nanovllm", {})
    tq, td, t8 = results.get("tf_qwen3_nanovllm", {}), results.get("tf_decode_bs1", {}), results.get("tf_8b_throughput", {})
    for key in ("decode_bs1_fraction_of_roofline", "decode_bs1_strict_fraction_of_roofline", "throughput_8b_1000_1000_tok_s",
                "copy_bandwidth_TBps"):
        if key in d:
            head[key] = d[key]
    if "throughput_qwen3_0p6b_nanovllm_tok_s" in q:
        head["throughput_qwen3_0p6b_nanovllm_tok_s"] = q["throughput_qwen3_0p6b_nanovllm_tok_s"]
        if "tf_qwen3_nanovllm_tok_s" in tq:
            head["ratio_vs_transformers"] = q["throughput_qwen3_0p6b_nanovllm_tok_s"] / tq["tf_qwen3_nanovllm_tok_s"]
    if "throughput_8b_1000_1000_tok_s" in d and "tf_8b_tok_s" in t8:
        head["ratio_vs_transformers_8b_throughput"] = d["throughput_8b_1000_1000_tok_s"] / t8["tf_8b_tok_s"]
    if "decode_ms_per_token" in d and "tf_decode_ms_per_token" in td:
        head["ratio_vs_transformers_decode_bs1"] = td["tf_decode_ms_per_token"] / d["decode_ms_per_token"]
    if card is None:
        card = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True).stdout.strip().splitlines()[0]
    commit = commit or os.environ.get("OCTAVO_COMMIT")  # the device copy of the tree has no .git
    if commit is None:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    return {"card": card, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command, "commit": commit, "results": {**head, "tasks": results}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks", nargs="+", choices=sorted(TASKS))
    ap.add_argument("--out-dir", default="benchmarks/results/tmp")
    ap.add_argument("--record", default=None, help="write the merged result record here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--throughput", action="store_true", help="decode_bs1: also run the 8B 1000/1000 throughput")
    ap.add_argument("--tp-prompts", type=int, default=512)
    ap.add_argument("--profile", action="store_true", help="decode_bs1: torch profiler table of 8 steps")
    ap.add_argument("--cprofile", action="store_true", help="qwen3_nanovllm: cProfile of the host side")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--tf-requests", type=int, default=64)
    ap.add_argument("--tf-batch", type=int, default=64)
    ap.add_argument("--tf-8b-new", type=int, default=200)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            res = TASKS[args.tasks[0]](args, tmp)
        with open(os.path.join(args.out_dir, f"{args.tasks[0]}.json"), "w") as f:
            json.dump(res, f, indent=1)
        return
    # each task in a fresh process, so GPU memory and CUDA graphs of one never crowd the next
    for task in args.tasks:
        argv = [sys.executable, __file__, task, "--child", *[a for a in sys.argv[1:] if a not in TASKS]]
        t = time.perf_counter()
        rc = subprocess.run(argv).returncode
        print(f"== {task}: rc {rc} in {time.perf_counter() - t:.0f} s", flush=True)
    if args.record:
        rec = merge_record(args.out_dir, " ".join(["python", *sys.argv]))
        with open(args.record, "w") as f:
            json.dump(rec, f, indent=1)
        print(json.dumps({k: v for k, v in rec["results"].items() if k != "tasks"}, indent=1), flush=True)


if __name__ == "__main__":
    main()
