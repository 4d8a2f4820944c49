"""The real scheduler + KV-cache manager driven without a model: what a workload's steps look like (issue 17 item 3).

    python benchmarks/schedule_sim.py --prompts 512 --in-len 1000 --out-len 1000 --kv-blocks 26420 \
        --max-num-seqs 512 --max-num-batched-tokens 8192

Every scheduled request that samples gets a token (ignore_eos), so the step sequence is exactly the engine's for
an ``ignore_eos`` benchmark. Per step it records the decode rows, the prefill tokens, the context each decode row
reads, and preemptions; then a simple H100 cost model (weights + KV bytes over the copy bandwidth, matmul FLOPs
over the measured bf16 rate) gives the time the GPU needs for that sequence
of steps (a step = its linear layers + its attention, each the larger of bytes/bandwidth and
FLOPs/rate). The point is the split (decode-only vs mixed steps, prompt tokens recomputed after preemption), not a
prediction to the millisecond. Defaults: the Llama-3-8B shape of benchmarks/gpu_e2e.py and its 0.9-of-80 GB
KV cache as measured on the H100 (26,420 blocks of 16 at max_num_seqs 512). The nano-vllm workload on the
Qwen3-0.6B shape (40,015 blocks, batch 0):

    python benchmarks/schedule_sim.py --workload nanovllm --kv-blocks 40015 --max-num-seqs 256 --weights-gb 1.19 \
        --params-b 0.6 --layers 28 --q-heads 16 --kv-heads 8 --head-dim 128

It runs the engine's admission policy (``--admission projected|greedy``, ``--ratio``, see core/kv_admission.py)
under ``AsyncScheduler`` with prefix caching on, as the engine runs on CUDA. ``--workload eos`` and ``chat`` stop
requests at EOS at points the scheduler cannot know (``max_tokens`` unset: max_model_len - prompt), to check that
admission does not over-reserve; ``--step-overhead-ms 3`` adds the per-step remainder that matches the H100.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpu_e2e's workload


def workload(args) -> list[tuple[int, int, int | None]]:
    """(prompt tokens, max_tokens, tokens after which it emits EOS or None: runs to max_tokens) per request."""
    if args.workload == "nanovllm":  # nano-vllm's: 256 requests, in/out U[100, 1024] (benchmarks/gpu_e2e.py)
        from gpu_e2e import nanovllm_workload

        return [(len(ids), n, None) for ids, n in nanovllm_workload()]
    if args.workload == "chat":  # short answers under a large max_tokens: EOS after U[1, 2 * out_len - 1] tokens
        rng = random.Random(args.seed)
        return [(rng.randint(args.in_len // 2, args.in_len * 3 // 2), args.max_model_len - args.in_len * 3 // 2,
                 rng.randint(1, 2 * args.out_len - 1)) for _ in range(args.prompts)]
    if args.workload == "eos":  # max_tokens unset (max_model_len - prompt); EOS after U[1, 2 * out_len - 1] tokens
        rng = random.Random(args.seed)
        return [(args.in_len, args.max_model_len - args.in_len, rng.randint(1, 2 * args.out_len - 1))
                for _ in range(args.prompts)]
    return [(args.in_len, args.out_len, None)] * args.prompts


def simulate(args) -> dict:
    from octavo.config import OctavoSettings
    from octavo.core.async_scheduler import AsyncScheduler
    from octavo.core.kv_cache.manager import KVCacheManager
    from octavo.core.messages import EngineCoreRequest
    from octavo.core.request import Request
    from octavo.core.scheduler import Scheduler
    from octavo.sampling_params import SamplingParams

    settings = OctavoSettings.from_kwargs(
        model="x", block_size=args.block_size, enable_prefix_caching=args.prefix_caching,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        kv_admission=args.admission, kv_admission_ratio=args.ratio,
        kv_admission_ratio_after_preemption=args.ratio_after_preemption,
        **({} if getattr(args, "overcommit", None) is None else {"kv_admission_overcommit": args.overcommit}))
    kv = KVCacheManager(args.kv_blocks, args.block_size, args.prefix_caching)
    sched = (AsyncScheduler if args.async_scheduling else Scheduler)(settings, kv, args.max_model_len)
    work = workload(args)
    eos, stop_at = 2, {}
    for i, (n_in, n_out, n_stop) in enumerate(work):
        ids = [1000 + (i * 7 + j) % 50000 for j in range(n_in)]  # distinct per request: no cache hits
        p = SamplingParams(max_tokens=n_out, ignore_eos=n_stop is None)
        sched.add_request(Request(EngineCoreRequest(f"r{i}", ids, p, 0.0, 0, eos_token_id=eos), n_out))
        stop_at[f"r{i}"] = n_stop

    def sampled(out):  # token 7, or EOS once a request reaches its stop point
        return {s.req.request_id: eos if stop_at[s.req.request_id] == s.req.num_output_tokens + 1 else 7
                for s in out.scheduled if s.samples}

    steps, in_flight = [], None
    while sched.has_unfinished_requests():
        out = sched.schedule()
        if out.is_empty:
            if in_flight is None:
                raise RuntimeError("scheduler returned an empty step with requests left")
            sched.update(in_flight, sampled(in_flight))
            in_flight = None
            continue
        dec = [s for s in out.scheduled if s.num_tokens == 1 and s.num_computed_tokens > 0]
        pre_tokens = sum(s.num_tokens for s in out.scheduled) - len(dec)
        # context each row attends over (decode: its whole sequence; prefill chunk: its prefix + chunk)
        kv_dec = sum(s.num_computed_tokens + 1 for s in dec)
        attn_pre = sum(s.num_tokens * (s.num_computed_tokens + s.num_tokens / 2) for s in out.scheduled
                       if not (s.num_tokens == 1 and s.num_computed_tokens > 0))
        steps.append((len(dec), pre_tokens, kv_dec, attn_pre, len(out.preempted_ids)))
        if args.async_scheduling:  # as the engine: step N+1 is scheduled before N's tokens are known
            sched.mark_scheduled(out)
            if in_flight is not None:
                sched.update(in_flight, sampled(in_flight))
            in_flight = out
        else:
            sched.update(out, sampled(out))
    if in_flight is not None:
        sched.update(in_flight, sampled(in_flight))
    args.total_out = sched.stats.num_generation_tokens
    return {"steps": steps, "prompt_tokens": sum(n for n, _, _ in work)}


def cost(steps, args) -> dict:
    """GPU seconds per step kind under the cost model (see the module docstring)."""
    bw, flops = args.bandwidth * 1e12, args.matmul_tflops * 1e12
    w_bytes, params = args.weights_gb * 1e9, args.params_b * 1e9
    kv_tok = args.layers * args.kv_heads * args.head_dim * 2 * 2  # K and V, bf16
    attn_flops_tok = 4 * args.layers * args.q_heads * args.head_dim  # QK^T + PV per (query, key) pair
    out = {k: {"steps": 0, "s": 0.0, "decode_rows": 0, "prefill_tokens": 0} for k in ("decode", "mixed", "prefill")}
    for n_dec, n_pre, kv_dec, attn_pre, _ in steps:
        kind = "decode" if n_pre == 0 else ("prefill" if n_dec == 0 else "mixed")
        # the linear layers and the attention run one after the other: each is bound by bytes or FLOPs
        linear = max(w_bytes / bw, 2 * params * (n_dec + n_pre) / flops)
        attention = max(kv_dec * kv_tok / bw, attn_flops_tok * attn_pre / (args.attn_tflops * 1e12))
        r = out[kind]
        r["steps"] += 1
        r["s"] += linear + attention + args.step_overhead_ms * 1e-3
        r["decode_rows"] += n_dec
        r["prefill_tokens"] += n_pre
    total = sum(r["s"] for r in out.values())
    tokens = args.total_out
    return {"by_kind": out, "gpu_s": total, "tok_s": tokens / total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=["fixed", "nanovllm", "eos", "chat"], default="fixed",
                    help="nanovllm: gpu_e2e.py's 256 requests with in/out U[100, 1024] (then pass the Qwen3-0.6B "
                    "cost flags, see the module docstring)")
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--in-len", type=int, default=1000)
    ap.add_argument("--out-len", type=int, default=1000)
    ap.add_argument("--kv-blocks", type=int, default=26420)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--bandwidth", type=float, default=3.03, help="TB/s (H100 copy, measured)")
    ap.add_argument("--matmul-tflops", type=float, default=600.0, help="achieved bf16 dense rate")
    ap.add_argument("--attn-tflops", type=float, default=230.0, help="prefill attention rate (triton, measured)")
    ap.add_argument("--weights-gb", type=float, default=15.01, help="bytes a step reads (no embedding table)")
    ap.add_argument("--params-b", type=float, default=7.5, help="matmul parameters (no embedding table)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--step-overhead-ms", type=float, default=0.0, help="host gap per step added to each step")
    ap.add_argument("--admission", choices=["projected", "greedy"], default="projected",
                    help="the scheduler's kv_admission (core/kv_admission.py)")
    ap.add_argument("--ratio", type=float, default=0.1, help="kv_admission_ratio")
    ap.add_argument("--ratio-after-preemption", type=float, default=0.7, help="kv_admission_ratio_after_preemption")
    ap.add_argument("--overcommit", type=float, default=None, help="kv_admission_overcommit (default: the setting's)")
    ap.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                    help="as the engine's default (gpu_e2e.py leaves it on)")
    ap.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                    help="AsyncScheduler, tokens known one step late (the engine's default on CUDA)")
    ap.add_argument("--seed", type=int, default=0, help="eos workload's stop points")
    ap.add_argument("--json")
    args = ap.parse_args()
    t = time.perf_counter()
    sim = simulate(args)
    steps = sim["steps"]
    res = {"args": vars(args), "num_steps": len(steps), "sim_s": time.perf_counter() - t,
           "preemptions": sum(s[4] for s in steps),
           "prefill_tokens_computed": sum(s[1] for s in steps),
           "prompt_tokens": sim["prompt_tokens"],
           "max_decode_batch": max(s[0] for s in steps),
           "mean_decode_batch": sum(s[0] for s in steps) / max(1, sum(1 for s in steps if s[0])),
           **cost(steps, args)}
    res["recomputed_tokens"] = res["prefill_tokens_computed"] - res["prompt_tokens"]
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
