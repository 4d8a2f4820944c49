"""Where the GPU still waits with async scheduling on (issue 17 items 1-3): diagnostics, not headline numbers.

    python benchmarks/gpu_async_diag.py bs1  --out r/bs1.json    # Llama-3-8B shape, batch-1 decode
    python benchmarks/gpu_async_diag.py nano --out r/nano.json   # nano-vllm workload, Qwen3-0.6B shape

``bs1``: one engine (async scheduling on, the default on CUDA), switched off/on while idle
(``set_async_scheduling``): ms per token of each mode as the difference of generations of 1 and N tokens
(best of two, interleaved), the captured forward alone, the same forward + lm_head + greedy argmax captured
in ONE graph vs the eager lm_head + argmax after the replay (what moving them into the graph would save),
every synchronizing CUDA call of an async decode (``torch.cuda.set_sync_debug_mode``, with the Python stack),
and a torch-profiler timeline of a few async steps: GPU busy fraction and the largest idle gaps between
kernels (with the kernels on both sides).

``nano``: the nano-vllm workload (256 requests, in/out U[100, 1024]) with async on; each completed step's
kind (decode-only / mixed / prefill-only), its interval since the previous completion (when GPU-bound: its
GPU time) and the step thread's host time per step, summed by kind; then a cProfile of both threads over a
shorter run (128 x 200 tokens; profiled, so slower) to see what the host still does per step.

``--device cpu --tiny``: a CPU dry run of the same code paths on a tiny random model (no profiler part).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import sys
import tempfile
import threading
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_e2e import LLAMA3_8B, QWEN3_0P6B, nanovllm_workload, write_config  # noqa: E402

TINY = dict(QWEN3_0P6B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=16384, torch_dtype="float32")


def _sync(cuda: bool) -> None:
    if cuda:
        import torch

        torch.cuda.synchronize()


def _llm(cfg: dict, tmp: str, args, **kw):
    from octavo import LLM

    d = write_config(cfg, tmp, "m")
    extra = dict(device="cpu", dtype="float32", async_scheduling=True, kv_cache_memory_bytes=64 << 20) \
        if args.device == "cpu" else dict(dtype="bfloat16")
    t0 = time.perf_counter()
    llm = LLM(model=d, load_format="dummy", skip_tokenizer_init=True, **extra, **kw)
    return llm, time.perf_counter() - t0


def _set_mode(llm, on: bool) -> None:
    from octavo.core.async_engine import set_async_scheduling

    set_async_scheduling(llm.llm_engine.core, on)


# ---------------------------------------------------------------------------------------------- bs1
def _sync_calls(llm, prompt, params) -> list[dict]:
    """Every synchronizing CUDA call during one async generation, with where it came from."""
    import torch

    seen: dict[str, dict] = {}
    orig = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        stack = [ln.strip() for ln in traceback.format_stack()[:-1] if "octavo" in ln or "/core/" in ln]
        key = "|".join(stack[-4:])
        rec = seen.setdefault(key, {"count": 0, "message": str(message)[:160], "stack": stack[-6:],
                                    "thread": threading.current_thread().name})
        rec["count"] += 1

    warnings.showwarning = show
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")
            try:
                llm.generate([prompt], params, use_tqdm=False)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        warnings.showwarning = orig
    return sorted(seen.values(), key=lambda r: -r["count"])


def _timeline(llm, prompt, params) -> dict:
    """GPU busy fraction over a few async decode steps and the largest idle gaps between device events."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        llm.generate([prompt], params, use_tqdm=False)
    ev = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    if not ev:
        return {"events": 0}
    # skip the prefill (first graph-less forward) and the tail: keep the last 3/4 of the events
    ev = ev[len(ev) // 4:]
    busy, gaps, end = 0.0, [], ev[0].time_range.start
    for a, b in zip([None, *ev[:-1]], ev):
        s, e = b.time_range.start, b.time_range.end
        if a is not None and s > end:
            gaps.append((s - end, a.name[:60], b.name[:60]))
        busy += max(0.0, e - max(s, end))
        end = max(end, e)
    span = end - ev[0].time_range.start
    gaps.sort(reverse=True)
    names: dict[str, list] = {}
    for e in ev:
        r = names.setdefault(e.name[:70], [0, 0.0])
        r[0] += 1
        r[1] += e.time_range.end - e.time_range.start
    top = sorted(names.items(), key=lambda kv: -kv[1][1])[:25]
    return {"events": len(ev), "span_us": span, "busy_us": busy, "busy_fraction": busy / span if span else None,
            "idle_us": span - busy, "gaps_over_5us": sum(1 for g in gaps if g[0] > 5),
            "idle_in_gaps_over_5us": sum(g[0] for g in gaps if g[0] > 5),
            "largest_gaps": [{"us": round(g, 1), "after": a, "before": b} for g, a, b in gaps[:15]],
            "device_ops": [{"name": n, "count": c, "us": round(t, 1)} for n, (c, t) in top]}


def _logits_in_graph(worker, reps: int = 50) -> dict:
    """The batch-1 captured forward, then lm_head + argmax eagerly, vs all three captured in one graph."""
    import torch

    gr = worker.runner.graph_runner
    model = worker.model
    if gr is None or 1 not in gr.graphs:
        return {"skipped": "no batch-1 graph"}
    from octavo.model import ForwardContext

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / reps * 1e3

    def eager_tail():
        gr.graphs[1].replay()
        model.compute_logits(gr.outputs[1][torch.tensor([0], device=gr.device)]).argmax(-1)

    md = gr.metadata[1]
    ctx = ForwardContext(attn_metadata=md, query_start_loc=gr.query_start_loc[:2])
    with torch.inference_mode():
        model.compute_logits(model(gr.input_ids[:1], gr.positions[:1], ctx)).argmax(-1)  # warm
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # a private pool: the engine's graphs keep theirs untouched
            model.compute_logits(model(gr.input_ids[:1], gr.positions[:1], ctx)).argmax(-1)
        res = {"graph_forward_ms": timed(gr.graphs[1].replay), "graph_forward_then_eager_lm_head_argmax_ms":
               timed(eager_tail), "graph_forward_lm_head_argmax_ms": timed(g.replay)}
    res["saved_ms"] = res["graph_forward_then_eager_lm_head_argmax_ms"] - res["graph_forward_lm_head_argmax_ms"]
    del g
    return res


def task_bs1(args, tmp) -> dict:
    import torch

    from octavo import SamplingParams

    cuda = args.device != "cpu"
    cfg = TINY if args.tiny else LLAMA3_8B
    llm, load_s = _llm(cfg, tmp, args, max_model_len=4096, max_num_seqs=256,
                       **({"gpu_memory_utilization": 0.9} if cuda else {}))
    core = llm.llm_engine.core
    worker = core.executor.driver
    res = {"load_s": load_s, "async_default": bool(core.settings.scheduler.async_scheduling),
           "weights_GB": sum(p.numel() * p.element_size() for p in worker.model.parameters()) / 1e9}
    print(json.dumps(res), flush=True)
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(1000, cfg["vocab_size"] - 1) for _ in range(512)]}
    n = args.tokens

    def gen(tokens):
        _sync(cuda)
        t = time.perf_counter()
        llm.generate([prompt], SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0), use_tqdm=False)
        _sync(cuda)
        return time.perf_counter() - t

    per = {False: [], True: []}
    for mode in (True, False):
        _set_mode(llm, mode)
        gen(8)  # warm
    for _ in range(2):  # interleaved, best of two per mode
        for mode in (True, False):
            _set_mode(llm, mode)
            per[mode].append((gen(n + 1) - gen(1)) / n * 1e3)
    _set_mode(llm, True)
    res.update({"ms_per_token_async_on": min(per[True]), "ms_per_token_async_off": min(per[False]),
                "runs_on": per[True], "runs_off": per[False], "tokens": n})
    if cuda:
        res["roofline_ms_b0_bw"] = (res["weights_GB"] * 1e9 + (512 + n / 2) * 32 * 8 * 128 * 4) / 3.0277e12 * 1e3
        res["fraction_on_b0_bw"] = res["roofline_ms_b0_bw"] / res["ms_per_token_async_on"]
    print(json.dumps(res), flush=True)
    p8 = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0)
    if cuda:
        res["logits_in_graph"] = _logits_in_graph(worker)
        print(json.dumps(res["logits_in_graph"]), flush=True)
        res["sync_calls_async"] = _sync_calls(llm, prompt, p8)
        print(json.dumps(res["sync_calls_async"], indent=1)[:3000], flush=True)
        res["timeline_async"] = _timeline(llm, prompt, p8)
        _set_mode(llm, False)
        res["timeline_sync"] = _timeline(llm, prompt, p8)
        _set_mode(llm, True)
        for k in ("timeline_async", "timeline_sync"):
            print(k, json.dumps({x: y for x, y in res[k].items() if x != "device_ops"}, indent=1)[:2500], flush=True)
    llm.llm_engine.shutdown()
    torch.cuda.empty_cache() if cuda else None
    return res


# ---------------------------------------------------------------------------------------------- nano
def _instrument(llm):
    """Record each completed step (kind, tokens, completion time) and the step thread's time per step."""
    core = llm.llm_engine.core
    worker = core.executor.driver
    log = {"done": [], "exec": []}
    complete, execute = core._complete, worker.execute

    def timed_complete(sched_out, result, early):
        sc = sched_out.scheduled
        n_dec = sum(1 for s in sc if s.num_tokens == 1)
        kind = "decode" if n_dec == len(sc) else ("prefill" if n_dec == 0 else "mixed")
        log["done"].append((time.perf_counter(), kind, sum(s.num_tokens for s in sc), len(sc)))
        return complete(sched_out, result, early)

    def timed_execute(*a, **k):
        t = time.perf_counter()
        try:
            return execute(*a, **k)
        finally:
            log["exec"].append(time.perf_counter() - t)

    core._complete, worker.execute = timed_complete, timed_execute
    return log


def _uninstrument(llm) -> None:
    core = llm.llm_engine.core
    del core._complete, core.executor.driver.execute  # the instance attributes: back to the class methods


def _summary(log: dict, t_start: float) -> dict:
    out: dict = {}
    prev = t_start
    for t, kind, tokens, reqs in log["done"]:
        r = out.setdefault(kind, {"steps": 0, "s": 0.0, "tokens": 0, "reqs": 0})
        r["steps"] += 1
        r["s"] += t - prev
        r["tokens"] += tokens
        r["reqs"] += reqs
        prev = t
    for r in out.values():
        r["ms_per_step"] = r["s"] / r["steps"] * 1e3
        r["mean_batch"] = r["reqs"] / r["steps"]
    ex = log["exec"]
    out["step_thread"] = {"steps": len(ex), "ms_per_step_mean": 1e3 * sum(ex) / max(len(ex), 1),
                          "ms_per_step_max": 1e3 * max(ex, default=0.0)}
    return out


def _timed_run(llm, prompts, params, cuda: bool, switch_interval: float) -> dict:
    core = llm.llm_engine.core
    log = _instrument(llm)
    st = core.scheduler.stats
    pre0, prompt0 = st.num_preemptions, st.num_prompt_tokens
    timers0 = core.step_timers.as_dict()  # core thread: own work (host_s) vs blocked on a step (wait_s)
    _sync(cuda)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    _sync(cuda)
    dt = time.perf_counter() - t0
    _uninstrument(llm)
    total = sum(len(o.outputs[0].token_ids) for o in outs)
    res = {"switch_interval_s": switch_interval, "output_tokens": total, "seconds": dt, "tok_s": total / dt,
           "by_kind": _summary(log, t0), "preemptions": st.num_preemptions - pre0,
           "prompt_tokens_computed": st.num_prompt_tokens - prompt0}
    t1 = core.step_timers.as_dict()
    steps = max(t1["steps"] - timers0["steps"], 1)
    res["core_thread_ms_per_step"] = {k: (t1[k] - timers0[k]) / steps * 1e3 for k in ("host_s", "wait_s",
                                                                                       "overlapped_s")}
    res["core_thread_ms_per_step"]["steps"] = steps
    print(json.dumps(res, indent=1), flush=True)
    return res


def task_nano(args, tmp) -> dict:
    from octavo import SamplingParams

    cuda = args.device != "cpu"
    cfg = TINY if args.tiny else QWEN3_0P6B
    kw = dict(max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=8192)
    if cuda:
        kw["gpu_memory_utilization"] = 0.9
    llm, load_s = _llm(cfg, tmp, args, **kw)
    core = llm.llm_engine.core
    reqs = nanovllm_workload(num=args.requests, lo=min(100, args.hi), hi=args.hi)
    llm.generate([{"prompt_token_ids": reqs[0][0]}], SamplingParams(max_tokens=8), use_tqdm=False)  # warm
    prompts = [{"prompt_token_ids": ids} for ids, _ in reqs]
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.6) for _, n in reqs]
    res = {"load_s": load_s, "async": bool(core.settings.scheduler.async_scheduling), "requests": len(reqs),
           "prompt_tokens": sum(len(ids) for ids, _ in reqs), "runs": []}
    default_si = sys.getswitchinterval()
    for si in args.switch_intervals or [default_si]:  # the GIL hand-over interval between the two threads
        sys.setswitchinterval(si)
        res["runs"].append(_timed_run(llm, prompts, params, cuda, si))
    sys.setswitchinterval(default_si)
    res.update(res["runs"][0])
    if args.cprofile:  # both threads: the core thread (this one) and the executor's step thread
        worker = core.executor.driver
        step_prof, main_prof = cProfile.Profile(), cProfile.Profile()
        inner = worker.execute

        def prof_execute(*a, **k):
            step_prof.enable()
            try:
                return inner(*a, **k)
            finally:
                step_prof.disable()

        worker.execute = prof_execute
        n = min(128, len(prompts))
        main_prof.enable()
        llm.generate(prompts[:n], [SamplingParams(max_tokens=200, ignore_eos=True, temperature=0.6)] * n,
                     use_tqdm=False)
        main_prof.disable()
        for name, p in (("core_thread", main_prof), ("step_thread", step_prof)):
            buf = io.StringIO()
            pstats.Stats(p, stream=buf).sort_stats("tottime").print_stats(22)
            res[f"cprofile_{name}"] = buf.getvalue()
            print(f"== cProfile {name}\n" + buf.getvalue()[-6000:], flush=True)
    llm.llm_engine.shutdown()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", choices=["bs1", "nano"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny random model (CPU dry run)")
    ap.add_argument("--tokens", type=int, default=256, help="bs1: tokens timed per generation")
    ap.add_argument("--requests", type=int, default=256, help="nano: number of requests")
    ap.add_argument("--hi", type=int, default=1024, help="nano: longest prompt / output")
    ap.add_argument("--cprofile", action="store_true", help="nano: cProfile both threads afterwards")
    ap.add_argument("--switch-intervals", type=float, nargs="*", help="nano: one timed run per sys.setswitchinterval "
                    "value (seconds; default: one run at the interpreter's value)")
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        res = (task_bs1 if args.task == "bs1" else task_nano)(args, tmp)
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
