"""Async scheduling on vs off, side by side in one process: one engine, modes switched while it is idle
(``octavo.core.async_engine.set_async_scheduling``), runs interleaved off/on/off/on so load drift hits both.

1. Throughput: a nano-vllm-style workload (random prompt ids, prompt and output lengths uniform in a range,
   ``ignore_eos``), greedy. Output tok/s per mode and the ratio on/off; whether the tokens are identical; the
   engine's step timers per step: the core thread's host work (schedule, build, update, outputs), the part of
   it done while a step ran on the worker (``overlapped``), and the part left on the critical path (``exposed``).
2. Structured outputs (``--structured-batch B``, needs a tokenizer and xgrammar): B requests under a JSON
   schema vs the same B unconstrained; the median time of decode steps in which all B decode, per mode, and
   the JSON-schema overhead in each mode.

    python benchmarks/async_scheduling.py --model PATH [--shape qwen3-0.6b] [--tokenizer PATH] [--device cuda]
        [--dtype bfloat16] [--num-requests 64] [--in-len 50 300] [--out-len 50 300] [--repeats 2]
        [--structured-batch 32] [--structured-steps 48] [--json OUT]

``--shape qwen3-0.6b`` writes a Qwen3-0.6B config into a temporary directory and loads random weights
(``load_format=dummy``); without ``--tokenizer`` the engine skips the tokenizer (throughput only).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time

from structured_outputs import timed_steps  # benchmarks/ is sys.path[0] when run as a script

QWEN3_0P6B = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                  vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  hidden_act="silu", tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
                  torch_dtype="bfloat16")
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
    "score": {"type": "number", "minimum": 0, "maximum": 100}}, "required": ["name", "tags", "score"]}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def set_mode(llm, on: bool) -> None:
    from octavo.core.async_engine import set_async_scheduling

    set_async_scheduling(llm.llm_engine.core, on)


def timer_delta(core, before: dict) -> dict:
    now = core.step_timers.as_dict()
    d = {k: now[k] - before[k] for k in now}
    steps = max(d["steps"], 1)
    return {"steps": d["steps"], "host_ms_per_step": 1e3 * d["host_s"] / steps,
            "overlapped_ms_per_step": 1e3 * d["overlapped_s"] / steps,
            "exposed_host_ms_per_step": 1e3 * (d["host_s"] - d["overlapped_s"]) / steps,
            "wait_ms_per_step": 1e3 * d["wait_s"] / steps, "exec_ms_per_step": 1e3 * d["exec_s"] / steps}


def bench_throughput(llm, args, vocab: int) -> dict:
    from octavo import SamplingParams

    rng = random.Random(0)
    work = [([rng.randrange(min(vocab, 10000)) for _ in range(rng.randint(*args.in_len))], rng.randint(*args.out_len))
            for _ in range(args.num_requests)]
    prompts = [{"prompt_token_ids": ids} for ids, _ in work]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in work]
    core = llm.llm_engine.core
    for mode in (False, True):  # warm-up: shapes, graphs, allocator
        set_mode(llm, mode)
        llm.generate(prompts[:4], [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * 4,
                     use_tqdm=False)
    runs = {False: [], True: []}
    timers, tokens = {}, {}
    for _ in range(args.repeats):
        for mode in (False, True):
            set_mode(llm, mode)
            before = core.step_timers.as_dict()
            sync(args.device)
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            sync(args.device)
            dt = time.perf_counter() - t0
            n = sum(len(o.outputs[0].token_ids) for o in outs)
            runs[mode].append(n / dt)
            timers[mode] = timer_delta(core, before)
            tokens[mode] = [list(o.outputs[0].token_ids) for o in outs]
            print(f"throughput async={mode}: {n} tokens in {dt:.2f} s = {n / dt:,.0f} tok/s; {timers[mode]}",
                  flush=True)
    off, on = max(runs[False]), max(runs[True])
    return {"requests": len(work), "in_len": args.in_len, "out_len": args.out_len,
            "off_tok_s": off, "on_tok_s": on, "on_over_off": on / off, "off_runs": runs[False], "on_runs": runs[True],
            "tokens_identical": tokens[False] == tokens[True], "timers_off": timers[False], "timers_on": timers[True]}


def bench_structured(llm, args) -> dict:
    from octavo import SamplingParams
    from octavo.core.messages import EngineCoreRequest
    from octavo.structured_outputs import StructuredOutputsParams

    core = llm.llm_engine.core
    eos = core.model_info.eos_token_id
    rng = random.Random(1)
    b = args.structured_batch
    prompts = [[rng.randrange(2, 2000) for _ in range(24)] for _ in range(b)]
    ids = iter(range(10**9))
    so = StructuredOutputsParams(json=SCHEMA)

    def run(mode: bool, kind: str) -> list[float]:
        set_mode(llm, mode)
        p = SamplingParams(temperature=0.0, max_tokens=args.structured_steps, ignore_eos=kind == "free",
                           structured_outputs=so if kind == "json" else None)
        reqs = [EngineCoreRequest(f"s{next(ids)}", pr, p, time.time(), eos_token_id=eos) for pr in prompts]
        return timed_steps(core, reqs, b)

    for mode in (False, True):  # warm: grammar compiled, buffers allocated
        run(mode, "json")
        run(mode, "free")
    med = {}
    for mode in (False, True):
        for kind in ("free", "json"):
            times = []
            for _ in range(args.repeats):
                times += run(mode, kind)
            med[(mode, kind)] = statistics.median(times) if times else float("nan")
            print(f"structured batch {b} async={mode} {kind}: {len(times)} full steps, median "
                  f"{med[(mode, kind)] * 1e3:.2f} ms", flush=True)
    res = {"batch": b}
    for mode, name in ((False, "off"), (True, "on")):
        res[f"{name}_free_step_ms"] = med[(mode, "free")] * 1e3
        res[f"{name}_json_step_ms"] = med[(mode, "json")] * 1e3
        res[f"{name}_json_overhead_pct"] = 100 * (med[(mode, "json")] / med[(mode, "free")] - 1)
    res["json_step_on_over_off"] = med[(True, "json")] / med[(False, "json")]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--shape", choices=["qwen3-0.6b", "tiny-qwen3"], help="tiny-qwen3: for CPU dry runs")
    ap.add_argument("--tokenizer")
    ap.add_argument("--device")
    ap.add_argument("--dtype")
    ap.add_argument("--quantization")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--in-len", type=int, nargs=2, default=[50, 300])
    ap.add_argument("--out-len", type=int, nargs=2, default=[50, 300])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--kv-cache-memory-bytes", type=int)
    ap.add_argument("--structured-batch", type=int, default=0)
    ap.add_argument("--structured-steps", type=int, default=48)
    ap.add_argument("--json")
    args = ap.parse_args()

    from octavo import LLM

    kw = dict(async_scheduling=True, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
              enable_prefix_caching=False, seed=0)
    for name in ("device", "dtype", "quantization", "kv_cache_memory_bytes"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    model = args.model
    if args.shape:
        model = os.path.join(tempfile.mkdtemp(), args.shape)
        os.makedirs(model)
        cfg = QWEN3_0P6B if args.shape == "qwen3-0.6b" else dict(
            QWEN3_0P6B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=16384, torch_dtype="float32")
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(cfg, f)
        kw["load_format"] = "dummy"
    if args.tokenizer:
        kw["tokenizer"] = args.tokenizer
    elif args.shape:
        kw["skip_tokenizer_init"] = True
    t0 = time.perf_counter()
    llm = LLM(model, **kw)
    info = llm.llm_engine.core.model_info
    args.device = str(info.device)
    result = {"model": args.shape or model, "device": info.device, "dtype": info.dtype,
              "quantization": info.quantization or "none", "start_s": time.perf_counter() - t0,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(result), flush=True)

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)

    result["throughput"] = bench_throughput(llm, args, info.vocab_size)
    save()
    if args.structured_batch:
        result["structured"] = bench_structured(llm, args)
        save()
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
