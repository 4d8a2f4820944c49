"""Tensor parallelism on GPUs: Llama-3-8B / Llama-3-70B shapes (dummy weights, bf16), one process per config.

    python benchmarks/gpu_tp.py --shape 8b --tp 2 1 --out-dir /tmp/r
    python benchmarks/gpu_tp.py --shape 70b --tp 4 --prompts 0 --out-dir /tmp/r
    OCTAVO_TP_ALLREDUCE=symm_mem python benchmarks/gpu_tp.py --tp 2 --tag symm --out-dir /tmp/r
    OCTAVO_TP_ALLREDUCE=custom python benchmarks/gpu_tp.py --tp 2 --tag custom --out-dir /tmp/r

Per config: batch-1 decode ms per output token (difference of 1- and 257-token generations after a 512-token
prompt, best of two: the prefill cancels) and its fraction of the roofline (weights per GPU / the copy rate),
then the ``--prompts`` x ``--in-len``/``--out-len`` throughput. TP=1 runs in process (``uni``); TP>1 through
the ``mp`` executor (one worker process per GPU, NCCL, or the all-reduce ``OCTAVO_TP_ALLREDUCE`` names). The
engine process itself never touches a GPU. Results: one JSON per config, written as soon as each number exists.

``--async-modes off on`` (session 4): the engine starts with async scheduling and is switched while idle
(``set_async_scheduling``), so each mode's batch-1 latency and throughput come from the same loaded model (TP=2:
the ``mp`` executor with two steps in flight). ``--graph-replay`` also times the captured batch-1 decode graph
alone on every rank at once (``collective_rpc``: the ranks' all-reduces pair up): the device time of a token,
which the latency minus it splits into host gap vs device work; and ``compute_logits`` on its output alone (LM head
+ the vocabulary all-gather), the largest device work outside the graph.
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
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks.gpu_tp for rpc
from gpu_e2e import LLAMA3_8B, write_config  # noqa: E402

LLAMA3_70B = {**LLAMA3_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
              "num_attention_heads": 64, "num_key_value_heads": 8}
TINY = {**LLAMA3_8B, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 4096, "torch_dtype": "float32"}  # CPU dry runs of this script
SHAPES = {"8b": LLAMA3_8B, "70b": LLAMA3_70B, "tiny": TINY}


def param_bytes(cfg: dict) -> int:
    h, i, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * i + 2 * h
    return 2 * (L * per_layer + 2 * v * h + h)


def run_config(tp: int, args) -> None:
    from octavo import LLM, SamplingParams

    cfg = SHAPES[args.shape]
    out = os.path.join(args.out_dir, f"{args.shape}_tp{tp}{'_' + args.tag if args.tag else ''}.json")
    res: dict = {"shape": args.shape, "tensor_parallel_size": tp, "executor": args.backend or ("uni" if tp == 1
                                                                                              else "mp"),
                 "allreduce": os.environ.get("OCTAVO_TP_ALLREDUCE", "default") if tp > 1 else None}

    def save():
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
        print(json.dumps(res), flush=True)

    d = write_config(cfg, tempfile.mkdtemp(), f"llama3-{args.shape}")
    t0 = time.perf_counter()
    modes = args.async_modes or [None]
    llm = LLM(model=d, load_format="dummy", dtype=args.dtype, skip_tokenizer_init=True, tensor_parallel_size=tp,
              max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=8192, distributed_executor_backend=args.backend,
              **({"async_scheduling": True} if args.async_modes else {}))
    res["start_s"] = time.perf_counter() - t0
    res["kv_blocks_per_rank"] = llm.llm_engine.model_info.num_kv_blocks
    save()
    rng = random.Random(0)
    lo, hi = min(1000, cfg["vocab_size"] // 4), min(120000, cfg["vocab_size"])
    prompt = {"prompt_token_ids": [rng.randrange(lo, hi) for _ in range(512)]}
    prompts = [{"prompt_token_ids": [rng.randrange(lo, hi) for _ in range(args.in_len)]} for _ in range(args.prompts)]
    weights_per_gpu = param_bytes(cfg) / tp
    res.update({"weights_GB_per_gpu": weights_per_gpu / 1e9, "copy_rate_Bps": args.copy_rate,
                "roofline_ms": weights_per_gpu / args.copy_rate * 1e3})

    def gen(prompts, n, temperature=0.0):
        t = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True, temperature=temperature),
                            use_tqdm=False)
        return time.perf_counter() - t, outs

    def use(mode):
        if mode is not None:
            from octavo.core.async_engine import set_async_scheduling

            set_async_scheduling(llm.llm_engine.core, mode == "on")
            core = llm.llm_engine.core
            core.step_timers = type(core.step_timers)()  # per mode, not cumulative
        return "" if mode is None else f"_async_{mode}"

    if args.measure_copy_rate:  # this call's cards: the roofline's denominator measured, not only assumed
        rates = llm.collective_rpc("benchmarks.gpu_tp_profile:copy_rate_Bps", args=[1 << 29])
        res["measured_copy_rate_Bps_by_rank"] = rates
        if all(r == r for r in rates):  # no NaN: every rank measured (min: the slowest rank sets the step)
            res["roofline_ms_measured_rate"] = weights_per_gpu / min(rates) * 1e3
        save()
    if args.ar_modes is not None:
        res["ar_as_started_by_rank"] = llm.collective_rpc("benchmarks.gpu_tp:ar_state")
    if args.graph_replay:
        ms = llm.collective_rpc("benchmarks.gpu_tp:graph_replay_ms", args=[1, 200])
        res["graph_replay_bs1_ms_by_rank"] = ms
        res["logits_bs1_ms_by_rank"] = llm.collective_rpc("benchmarks.gpu_tp:logits_ms", args=[1, 200])
        save()
    if args.kernel_table:
        res["graph_kernels_bs1_by_rank"] = llm.collective_rpc("benchmarks.gpu_tp_profile:graph_kernel_table",
                                                              args=[1, 20])
        save()
    if args.layer_trace:
        res["graph_layer_trace_by_rank"] = llm.collective_rpc("benchmarks.gpu_tp_profile:graph_layer_trace",
                                                              args=[1, 3])
        save()
    bs1_tokens = {}
    for mode in modes:  # batch-1 latency in every mode first: the goal's number
        sfx = use(mode)
        gen([prompt], 16)  # warm-up (the prefill cancels in t2 - t1; its prefix-cache hits too)
        t1 = min(gen([prompt], 1)[0] for _ in range(2))
        runs = [gen([prompt], 257) for _ in range(2)]
        t2 = min(dt for dt, _ in runs)
        bs1_tokens[mode] = list(runs[-1][1][0].outputs[0].token_ids)
        res[f"bs1_tokens{sfx}"] = bs1_tokens[mode]  # greedy: compared across configs (TP=1, NCCL, custom)
        per_tok = (t2 - t1) / 256
        res.update({f"decode_bs1_ms_per_token{sfx}": per_tok * 1e3,
                    f"decode_bs1_fraction_of_roofline{sfx}": weights_per_gpu / args.copy_rate / per_tok})
        if "roofline_ms_measured_rate" in res:
            res[f"decode_bs1_fraction_of_measured_roofline{sfx}"] = res["roofline_ms_measured_rate"] / 1e3 / per_tok
        if args.layer_trace and mode == modes[0]:  # the real decode steps' kernels (attention at ~512-560 tokens)
            llm.collective_rpc("benchmarks.gpu_tp_profile:decode_trace_start")
            gen([prompt], 49)
            res["decode_layer_trace_by_rank"] = llm.collective_rpc("benchmarks.gpu_tp_profile:decode_trace_stop",
                                                                   args=[48])
        if len(bs1_tokens) > 1:  # greedy, same prompt: the modes must agree token for token
            res["bs1_greedy_tokens_identical_across_modes"] = all(t == bs1_tokens[modes[0]]
                                                                  for t in bs1_tokens.values())
        save()
    if args.prompts:  # gpu_e2e.warm_up's shapes (TP=1's e2e_8b.sh has them; its device sync is not for this process):
        t, w = time.perf_counter(), random.Random(11)  # no Triton build or autotune inside the timed run
        for lens in ([(args.in_len, 1 + i % 32) for i in range(min(args.prompts, 64))], [(2, 1)], [(3, 1)], [(5, 1)]):
            llm.generate([{"prompt_token_ids": [w.randrange(lo, hi) for _ in range(n)]} for n, _ in lens],
                         [SamplingParams(max_tokens=m, ignore_eos=True, temperature=args.temperature) for _, m in lens],
                         use_tqdm=False)
        res["throughput_warmup_s"] = time.perf_counter() - t
    for mode in modes if args.prompts else []:
        sfx = use(mode)
        llm.reset_prefix_cache()  # NOTE: same prompts in every mode; without this a later mode skips the prefill
        dt, outs = gen(prompts, args.out_len, args.temperature)
        total = sum(len(o.outputs[0].token_ids) for o in outs)
        res.update({"throughput_workload": f"{args.prompts} x {args.in_len}/{args.out_len}",
                    "throughput_temperature": args.temperature,
                    f"throughput_s{sfx}": dt, f"throughput_tok_s{sfx}": total / dt,
                    f"step_timers{sfx}": llm.llm_engine.core.step_timers.as_dict()})
        save()
    def bs1():  # batch-1 ms/token after a warm-up, and the greedy tokens (as the first measurement above)
        gen([prompt], 16)
        t1 = min(gen([prompt], 1)[0] for _ in range(2))
        runs = [gen([prompt], 257) for _ in range(2)]
        return (min(dt for dt, _ in runs) - t1) / 256 * 1e3, list(runs[-1][1][0].outputs[0].token_ids)

    if args.gemv_ab:  # per-shape GEMV tiles in a PDL chain, the winners A/B'd in this engine (gpu_tp_gemv.py)
        from gpu_tp_gemv import sweep_and_ab

        sweep_and_ab(llm, res, args.out_dir, args.gemv_ab, bs1, save)
    if args.table_ab:  # the committed fixed GEMV tiles vs the autotuner's, alternating (gpu_tp_gemv.py)
        from gpu_tp_gemv import table_ab

        table_ab(llm, res, args.table_ab, bs1, save)
    for ar_mode in args.ar_modes or []:  # the same engine, its graphs re-captured with another all-reduce
        key, n = f"ar_{ar_mode}", 2
        while key in res:  # a mode named again (alternating A/B rounds): its own record, "#2", "#3", ...
            key, n = f"ar_{ar_mode}#{n}", n + 1
        m = res[key] = {"switched_by_rank": llm.collective_rpc("benchmarks.gpu_tp:switch_all_reduce", args=[ar_mode])}
        if args.graph_replay:
            m["graph_replay_bs1_ms_by_rank"] = llm.collective_rpc("benchmarks.gpu_tp:graph_replay_ms", args=[1, 200])
        if args.kernel_table:
            m["graph_kernels_bs1_by_rank"] = llm.collective_rpc("benchmarks.gpu_tp_profile:graph_kernel_table",
                                                                args=[1, 20])
        if args.layer_trace:
            m["graph_layer_trace_by_rank"] = llm.collective_rpc("benchmarks.gpu_tp_profile:graph_layer_trace",
                                                                args=[1, 3])
        ms, tokens = bs1()
        m.update({"decode_bs1_ms_per_token": ms, "bs1_tokens": tokens})
        save()
    if args.graph_replay_no_allreduce:  # last: it leaves the engine's graphs without all-reduces (wrong sums)
        res["graph_replay_bs1_ms_no_allreduce_by_rank"] = llm.collective_rpc(
            "benchmarks.gpu_tp:graph_replay_ms_without_allreduce", args=[1, 200])
        save()
    llm.llm_engine.shutdown()


def logits_ms(worker, size: int, iters: int) -> float:
    """ms per ``compute_logits`` of the batch-1 graph's output on this rank (LM head GEMV and, with TP, the
    all-gather of the vocabulary shards; every rank at once): device work of a step outside the graph."""
    import torch

    runner = getattr(worker.runner, "graph_runner", None)
    out = getattr(runner, "outputs", {}).get(size)
    if out is None:
        return float("nan")
    with torch.inference_mode():
        for _ in range(5):
            worker.runner.model.compute_logits(out)
        torch.cuda.synchronize(worker.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            worker.runner.model.compute_logits(out)
        end.record()
        end.synchronize()
    return start.elapsed_time(end) / iters


def ar_state(worker) -> str:
    """What all-reduce this rank runs now (a ``collective_rpc`` target)."""
    from octavo.nn import parallel

    ar = parallel._ALL_REDUCE
    from octavo.plugins.platforms.cuda_pdl import pdl_on

    return (f"{type(ar).__name__ if ar else 'nccl'}, defer_rows={getattr(ar, 'defer_rows', None)}, "
            f"ll={getattr(ar, 'll', None)}, push={getattr(ar, 'push', None)}, pdl={pdl_on()}, "
            f"early_poll={getattr(ar, 'early_poll', None)}, crossing_preload={getattr(ar, 'crossing_preload', None)}")


def switch_all_reduce(worker, mode: str) -> str:
    """Install another all-reduce on this rank and re-capture its decode graphs (a ``collective_rpc`` target,
    every rank at once): ``nccl`` (torch.distributed for the all-reduces, the LM head's all-gather and the
    sampled ids' broadcast), ``custom`` (the one-shot kernels, no norm fusion) or ``fused`` (the one-shot kernels
    with the all-reduce + RMSNorm fusion, as installed at start); suffixes ``+pdl`` (programmatic dependent
    launches, plugins/platforms/cuda_pdl.py) and ``+silu`` (the gate/up + SiLU GEMV, cuda_mlp_fusion.py, where
    it was installed at start: the default) and ``+ll`` (the one-shot all-reduce's LL protocol,
    cuda_allreduce_ll.py) and ``+push`` (fused only: the row-parallel GEMV sends its output itself,
    cuda_allreduce_gemv.py) and ``+early`` (with push and pdl: the consumer polls the peer's words before its
    PDL wait, OCTAVO_TP_EARLY_POLL) and ``+rw`` (fused only: its kernel loads the residual and norm weight before its PDL
    wait, OCTAVO_TP_CROSSING_PRELOAD) turn those on, their absence off; ``+w2``/``+w8``/``+w16``: the fused all-reduce +
    norm kernel with that many warps (its rule: 4 up to 4096 wide); ``+n8``/``+n16``: every RMSNorm launch of <= 4 rows,
    plain (cuda_fusions) and fused, with that many warps (OCTAVO_NORM_SMALL_ROWS_WARPS; absent: the rule). Since session 12
    TP=2's defaults are ``fused+pdl+silu+push+rw+n16`` (a mode without +rw / +n16 turns those off). Returns what runs now."""
    from octavo.nn import parallel
    from octavo.plugins.platforms.cuda_mlp_fusion import set_silu_gemv
    from octavo.plugins.platforms.cuda_pdl import set_pdl

    label = mode
    mode, *flags = mode.split("+")
    warps, nwarps = {"w2": 2, "w8": 8, "w16": 16}, {"n4": 4, "n8": 8, "n16": 16}
    if mode not in ("nccl", "custom", "fused") or len(set(flags) & set(warps)) > 1 or len(set(flags) & set(nwarps)) > 1 \
            or not set(flags) <= {"pdl", "silu", "ll", "push", "early", "rw", *warps, *nwarps}:
        raise ValueError(f"unknown all-reduce mode {label!r}: nccl|custom|fused [+pdl] [+silu] [+ll] [+push] "
                         "[+w2|+w8|+w16] [+n4|+n8|+n16] [+early] [+rw]")
    from octavo.plugins.platforms.cuda_fusions import norm_warps, set_small_rows_norm_warps

    set_small_rows_norm_warps(next((nwarps[f] for f in flags if f in nwarps), 0))
    if "push" in flags and mode != "fused":
        raise ValueError(f"{label!r}: +push (cuda_allreduce_gemv.py) needs the fused mode")
    if "rw" in flags and mode != "fused":
        raise ValueError(f"{label!r}: +rw (OCTAVO_TP_CROSSING_PRELOAD) needs the fused mode")
    if "early" in flags and not {"push", "pdl"} <= set(flags):
        raise ValueError(f"{label!r}: +early (OCTAVO_TP_EARLY_POLL) needs +push and +pdl")
    set_pdl("pdl" in flags)
    set_silu_gemv("silu" in flags)
    if hasattr(parallel._ALL_REDUCE, "ll") or hasattr(getattr(worker, "_bench_ar", None), "ll"):
        (getattr(worker, "_bench_ar", None) or parallel._ALL_REDUCE).ll = "ll" in flags  # cuda_allreduce_ll.py

    ar = getattr(worker, "_bench_ar", None) or parallel._ALL_REDUCE  # None: TP=1 or NCCL (only PDL switches)
    if ar is not None and not hasattr(worker, "_bench_ar"):
        worker._bench_ar, worker._bench_defer = ar, getattr(ar, "defer_rows", 0)
    if ar is not None and mode == "nccl":
        parallel.set_all_reduce(None)
        parallel.set_all_gather(None)
    elif ar is not None:
        parallel.set_all_reduce(ar)
        parallel.set_all_gather(getattr(ar, "all_gather", None))
        if hasattr(ar, "defer_rows"):
            ar.flush()
            ar.defer_rows = worker._bench_defer if mode == "fused" else 0
        if hasattr(ar, "push"):
            ar.push = "push" in flags  # the row-parallel GEMV sends its output (cuda_allreduce_gemv.py)
            ar.early_poll = "early" in flags  # its consumer polls the peer's words before the PDL wait
            ar.num_pushed = 0
        ar.norm_warps = next((warps[f] for f in flags if f in warps), 0)  # the fused AR + norm kernel (0: its rule)
        ar.crossing_preload = "rw" in flags  # the fused kernel's residual + weight loads before its PDL wait
    runner = getattr(worker.runner, "graph_runner", None)
    if runner is not None:
        runner.capture()
    return (f"{label}: {type(parallel._ALL_REDUCE).__name__}, "
            f"defer_rows={getattr(parallel._ALL_REDUCE, 'defer_rows', None)}, ll={getattr(ar, 'll', None)}, "
            f"push={getattr(ar, 'push', None)} ({getattr(ar, 'num_pushed', 0)} GEMVs pushed in the capture), "
            f"early_poll={getattr(ar, 'early_poll', None)}, crossing_preload={getattr(ar, 'crossing_preload', None)}, "
            f"small_rows_norm_warps={norm_warps(1, 4096)}")


def graph_replay_ms_without_allreduce(worker, size: int, iters: int) -> float:
    """ms per replay of the batch-1 decode graph re-captured with every tensor-parallel all-reduce skipped (an
    identity installed through ``set_all_reduce``): the step's device time minus its all-reduces, so the
    all-reduces' in-step cost is the difference to :func:`graph_replay_ms`. Leaves wrong graphs behind: for a
    benchmark's last measurement only."""
    from octavo.nn.parallel import set_all_reduce

    runner = getattr(worker.runner, "graph_runner", None)
    if runner is None or size not in runner.graphs:
        return float("nan")
    set_all_reduce(lambda x: x)
    runner.capture_sizes = [size]
    runner.capture()
    return graph_replay_ms(worker, size, iters)


def graph_replay_ms(worker, size: int, iters: int) -> float:
    """ms per replay of the captured decode graph of ``size`` rows on this rank (a ``collective_rpc`` target:
    every rank replays at once, so the all-reduces inside pair up). Static inputs as last left: position 0 of
    the null block, i.e. the weights-and-collectives cost of a token, with next to no attention."""
    import torch

    runner = getattr(worker.runner, "graph_runner", None)
    graph = getattr(runner, "graphs", {}).get(size)
    if graph is None:
        return float("nan")
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize(worker.device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--in-len", type=int, default=1000)
    ap.add_argument("--out-len", type=int, default=1000)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-num-seqs", type=int, default=512, help="also the largest captured decode graph")
    ap.add_argument("--backend", default=None, help="distributed_executor_backend (e.g. mp for TP=1 through "
                    "worker processes: the executor's host overhead alone)")
    ap.add_argument("--async-modes", nargs="+", choices=["off", "on"], default=None, help="start with async "
                    "scheduling and measure each mode in turn on the same engine (set_async_scheduling)")
    ap.add_argument("--graph-replay", action="store_true", help="time the batch-1 decode graph alone per rank")
    ap.add_argument("--graph-replay-no-allreduce", action="store_true", help="last: the batch-1 graph re-captured "
                    "without its all-reduces, timed alone (their in-step cost; leaves the engine's sums wrong)")
    ap.add_argument("--kernel-table", action="store_true", help="a torch.profiler kernel table of the batch-1 "
                    "decode graph per rank (as started and after each --ar-modes switch)")
    ap.add_argument("--layer-trace", action="store_true", help="the batch-1 graph's kernels per layer position "
                    "(and once, the real decode steps' kernels folded per layer: attention at the real context) "
                    "(benchmarks/gpu_tp_profile.py graph_layer_trace), as started and after each --ar-modes switch")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of the throughput run "
                    "(1.0: gpu_e2e.py's, the lead's TP=1 e2e run)")
    ap.add_argument("--ar-modes", nargs="*", metavar="MODE", default=None, help="after the "
                    "measurements as started, switch the all-reduce in turn (graphs re-captured) and measure "
                    "batch-1 again (TP>1 started with OCTAVO_TP_ALLREDUCE=custom): nccl|custom|fused, optionally "
                    "+pdl, +silu, +ll (switch_all_reduce)")
    ap.add_argument("--gemv-ab", type=int, default=0, metavar="ROUNDS", help="sweep the batch-1 GEMV tiles per "
                    "shape on every rank, then A/B the winners vs the autotuner's ROUNDS times (gpu_tp_gemv.py)")
    ap.add_argument("--table-ab", type=int, default=0, metavar="ROUNDS", help="A/B the committed GEMV tile table "
                    "(plugins/platforms/cuda_gemv_table.py) vs the autotuner's tiles ROUNDS times (gpu_tp_gemv.py)")
    ap.add_argument("--tag", default="", help="suffix of the JSON name (e.g. the all-reduce tried)")
    ap.add_argument("--copy-rate", type=float, default=3.0e12, help="bytes/s read+written, device copy (H100)")
    ap.add_argument("--measure-copy-rate", action="store_true", help="also measure every rank's copy rate in the "
                    "engine (512 MiB copies, after the KV cache took its share) and report the batch-1 fraction of that roofline")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.one is not None:
        return run_config(args.one, args)
    argv, rest = sys.argv[1:], []
    while argv:  # every option as given but --tp's list
        a = argv.pop(0)
        if a == "--tp":
            while argv and argv[0].isdigit():
                argv.pop(0)
        else:
            rest.append(a)
    for tp in args.tp:  # each config in a fresh process: GPU memory and NCCL state start clean
        cmd = [sys.executable, __file__, *rest, "--one", str(tp)]
        print("config tp", tp, "exit", subprocess.call(cmd), flush=True)


if __name__ == "__main__":
    main()
