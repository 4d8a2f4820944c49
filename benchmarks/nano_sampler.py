"""The nano-vllm workload (Qwen3-0.6B shape, 256 x U[100, 1024] in/out, temperature 0.6, ignore_eos) with the
fused Triton sampler and with the torch sampler, in ONE engine (same process, same card, back to back), then
per decode step: device time of the forward (graph replay), ``compute_logits`` and the sampler (CUDA events),
and a torch-profiler kernel table of 24 decode steps: where a decode step's device time goes.

    python benchmarks/nano_sampler.py --out /tmp/nano_sampler.json [--budget-s 50] [--runs fused torch fused]

The sampler is switched between runs through ``runner.sampler.fused`` (what ``OCTAVO_FUSED_SAMPLER`` sets at
start). Stages stop being started when ``--budget-s`` would be exceeded (the device scripts are time-boxed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_e2e import gen_timed, make_llm, nanovllm_workload, qwen3_config, write_config  # noqa: E402


def kernel_table(prof, steps: int, limit: int = 40) -> list[dict]:
    """Per-kernel device time (µs per step) of a profiled window, largest first."""
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
        if dev_us and dev_us > 0:
            rows.append({"name": e.key[:140], "us_per_step": round(dev_us / steps, 2),
                         "calls_per_step": round(e.count / steps, 2)})
    rows.sort(key=lambda r: -r["us_per_step"])
    return rows[:limit]


def profile_decode_steps(llm, worker, reqs, SamplingParams, max_tokens: int = 96, window: int = 24) -> dict:
    """The first requests of the workload (real prompt lengths, ``max_tokens`` each): CUDA events around each
    graph-replayed decode step's forward (input copies + replay), ``compute_logits`` and the sampler, and a
    CUDA-only profiler window over ``window`` decode steps from the 16th on."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    runner, model = worker.runner, worker.runner.model
    graphs = runner.graph_runner
    marks: list[list] = []
    state = {"decode": 0, "prof": None, "done": False}
    prof = profile(activities=[ProfilerActivity.CUDA])
    fwd, logits_fn = runner.forward, model.compute_logits

    def ev():
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def forward(inputs, *a, **k):
        before = graphs.num_replays if graphs else 0
        e0 = ev()
        out = fwd(inputs, *a, **k)
        if graphs and graphs.num_replays > before:
            state["decode"] += 1
            if state["decode"] == 16 and not state["done"]:
                prof_call("start")
                state["prof"] = 0
            marks.append([inputs.layout.num_reqs, e0, ev()])
        return out

    def compute_logits(h):
        out = logits_fn(h)
        if marks and len(marks[-1]) == 3:
            marks[-1].append(ev())
        return out

    class TimedSampler:
        def __call__(self, logits, b):
            out = real_sampler(logits, b)
            if marks and len(marks[-1]) == 4:
                marks[-1].append(ev())
                if state["prof"] is not None and not state["done"]:
                    state["prof"] += 1
                    if state["prof"] == window:
                        prof_call("stop")
                        state["done"] = True
            return out

    def prof_call(what):  # never let the profiler break the engine's step
        try:
            torch.cuda.synchronize()
            getattr(prof, what)()
        except Exception as e:  # noqa: BLE001
            state["error"] = f"profiler {what}: {e!r}"
            state["done"] = True

    real_sampler = runner.sampler
    runner.forward, model.compute_logits, runner.sampler = forward, compute_logits, TimedSampler()
    try:
        prompts = [{"prompt_token_ids": ids} for ids, _ in reqs]
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.6)
        t = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
    finally:
        del runner.forward, model.compute_logits
        runner.sampler = real_sampler
        if state["prof"] is not None and not state["done"]:
            prof_call("stop")
    full = [m for m in marks if len(m) == 5]
    rows = [(m[0], m[1].elapsed_time(m[2]), m[2].elapsed_time(m[3]), m[3].elapsed_time(m[4])) for m in full]
    periods = [a[1].elapsed_time(b[1]) for a, b in zip(full, full[1:])]
    n = max(len(rows), 1)
    out = {"requests": len(reqs), "max_tokens": max_tokens, "seconds": dt, "decode_steps_timed": len(rows),
           "mean_batch": sum(r[0] for r in rows) / n, "forward_ms": sum(r[1] for r in rows) / n,
           "compute_logits_ms": sum(r[2] for r in rows) / n, "sampler_ms": sum(r[3] for r in rows) / n,
           "step_period_ms": sorted(periods)[len(periods) // 2] if periods else None,
           "note": "events on the step thread's stream: forward = graph-input copies + replay; step period = "
                   "median interval between consecutive decode forwards (GPU clock)"}
    if "error" in state:
        out["profile_error"] = state["error"]
    elif state["done"]:
        out["profile_window_steps"] = window
        out["kernels"] = kernel_table(prof, window)
    return out


def main() -> None:
    import torch

    from octavo import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--runs", nargs="+", default=["fused", "torch"], choices=["fused", "torch"])
    ap.add_argument("--profile-batch", type=int, default=128, help="requests of the decode-step breakdown run")
    args = ap.parse_args()
    t_start = time.perf_counter()
    res: dict = {"card": torch.cuda.get_device_name(), "command": " ".join(["python", *sys.argv]), "runs": []}

    def save() -> None:
        res["elapsed_s"] = time.perf_counter() - t_start
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    with tempfile.TemporaryDirectory() as tmp:
        cfg, arch = qwen3_config()
        d = write_config(cfg, tmp, "qwen3-0.6b")
        llm, worker, info = make_llm(d, max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=256,
                                     max_num_batched_tokens=8192)
        sampler = worker.runner.sampler
        res.update(architecture=arch, fused=info.get("fused"), start_s=time.perf_counter() - t_start)
        reqs = nanovllm_workload()
        prompts = [{"prompt_token_ids": ids} for ids, _ in reqs]
        params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.6) for _, n in reqs]
        for mode in ("torch", "fused"):  # warm-up: compiles the fused kernels, both paths run once
            sampler.fused = mode == "fused"
            gen_timed(llm, prompts[:4], [SamplingParams(max_tokens=8, temperature=0.6)] * 4)
        print(f"engine ready in {time.perf_counter() - t_start:.1f} s", flush=True)
        last = 10.0
        for mode in args.runs:
            if time.perf_counter() - t_start + last + 2 > args.budget_s:
                res["runs"].append({"sampler": mode, "skipped": "time budget"})
                continue
            sampler.fused = mode == "fused"
            dt, outs = gen_timed(llm, prompts, params)
            last = dt
            total = sum(len(o.outputs[0].token_ids) for o in outs)
            run = {"sampler": mode, "seconds": dt, "output_tokens": total,
                   "throughput_qwen3_0p6b_nanovllm_tok_s": total / dt}
            print(json.dumps(run), flush=True)
            res["runs"].append(run)
            save()
        if time.perf_counter() - t_start + 6 < args.budget_s:
            sampler.fused = True
            try:
                res["decode_steps"] = profile_decode_steps(llm, worker, reqs[:args.profile_batch], SamplingParams)
            except Exception as e:  # noqa: BLE001 - a diagnostic: record why, keep the timed runs
                res["decode_steps"] = {"error": repr(e)}
            for r in res["decode_steps"].get("kernels", [])[:25]:
                print(f"{r['us_per_step']:9.1f} us/step {r['calls_per_step']:6.1f}x  {r['name']}", flush=True)
            print(json.dumps({k: v for k, v in res["decode_steps"].items() if k != "kernels"}), flush=True)
        save()
        llm.llm_engine.shutdown()


if __name__ == "__main__":
    main()
