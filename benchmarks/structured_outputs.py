"""Structured-output overhead on the embedded SmolLM2 (CPU by default; any device with ``--device``).

1. Per-step decode cost of JSON-schema decoding vs unconstrained, at batch 1 and batch 32: the same prompts,
   greedy; the engine core's ``step()`` is timed directly and only steps in which every request of the batch
   decodes are counted (prefill and the ragged tail are left out). Three modes, interleaved (A B C A B C ...)
   so load drift hits all alike: ``free`` (no grammar), ``overlap`` (the default: bitmasks filled on a host
   thread while the forward runs) and ``serial`` (fill first on the engine thread, then the step: what an
   out-of-process executor does and what octavo did before); with ``--compare-maxlength`` also
   ``overlap_maxlength`` (xgrammar compiling the schema's short ``maxLength`` strings itself, before
   plugins/structured_output/xgrammar_schema.py: 10-40 ms per row to fill). Reported as ratios to ``free``, and as the
   host time per step the forward did not hide (the engine's own timers: prepare + wait for the fill +
   apply + accept), which a loaded machine distorts far less than wall-clock ratios.
2. Grammar compile time for a 50-property schema: front-end validation, the tokenizer-specific compile
   uncached (a fresh backend, so no library cache either), and cached (a second request with the same schema:
   the engine core's cache by spec); plus the host bitmask fill per step and the logits mask apply alone.

    python benchmarks/structured_outputs.py [--backend xgrammar|guidance] [--steps 24] [--repeats 3]
        [--batches 1 32] [--model PATH] [--tokenizer PATH] [--load-format dummy] [--device cpu|cuda]
        [--dtype float32] [--quantization none] [--skip-compile] [--compare-maxlength] [--json OUT]
        [--async-modes off on] [--modes overlap json_async] [--show-outputs 2]

``--async-modes on`` adds ``free_async`` and ``json_async``: the same engine switched to async scheduling while idle
(step N+1 scheduled while N runs; the bitmask fill of N+1 starts once N's tokens advanced the grammars); their
overhead is against ``free_async``. Every mode and what it switches: benchmarks/structured_modes.py; part 2:
benchmarks/structured_compile.py; what they share with benchmarks/structured_ab.py: benchmarks/structured_common.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules below, run as a script
from structured_common import HOST_KEYS, SCHEMA, thread_cpu_s, timed_steps  # noqa: E402
from structured_compile import bench_compile  # noqa: E402
from structured_modes import MODE_KEYS, apply_knobs, baseline, build_modes, defaults, restore  # noqa: E402


def bench_decode(args) -> dict:
    from octavo import LLM, SamplingParams
    from octavo.core import grammar_device_gate
    from octavo.core.messages import EngineCoreRequest
    from octavo.structured_outputs import StructuredOutputsParams

    kw = {"max_model_len": 512, "max_num_seqs": max(args.batches), "structured_outputs_backend": args.backend,
          "enable_prefix_caching": False}
    if args.async_modes:  # start synchronous; the "_async" modes switch the idle engine on and back
        kw["async_scheduling"] = False
    for name in ("model", "tokenizer", "device", "quantization", "dtype", "load_format"):
        if getattr(args, name):
            kw[name] = getattr(args, name)
    counter = None
    if args.count_calls:  # (Python < 3.12: hooked before the engine's threads start; this run's timings are slower)
        from call_counter import CallCounter

        counter = CallCounter(skip=("wait_host_flag",))
        counter.arm()
    llm = LLM(**kw)
    engine = llm.llm_engine
    core = engine.core
    if args.host_gate:
        from structured_hostgate import install_host_gate

        install_host_gate(core)
    executor_cls = type(core.executor)
    overlapped = executor_cls.execute_structured

    def serial(self, batch, grammar):  # fill on this thread first, then the step (same apply path as overlap)
        grammar.wait()
        return self.driver.execute(batch, grammar=grammar)
    tok = engine.tokenizer
    so = StructuredOutputsParams(json=SCHEMA)
    # mode -> (structured outputs, async scheduling on, fill before the step, xgrammar's own maxLength form,
    #          GIL switch interval, engine knobs): benchmarks/structured_modes.py
    saved = defaults(core)
    dflt = {k: saved[k] for k in MODE_KEYS}
    # device events around each device wait: "device_wait" in the host ms (two events per step on the runner's thread;
    # --wait-events off: the engine as it ships, no events)
    grammar_device_gate.TIME_WAIT = saved["time_wait"] = args.wait_events == "on"  # (a mode's "probe" sets it)
    modes = build_modes(args, so, dflt)
    import octavo.plugins.structured_output.xgrammar_backend as xgb
    rewrite = xgb.bounded_strings_as_patterns
    result = {"device": str(core.model_info.device), "dtype": str(core.model_info.dtype),
              "quantization": core.model_info.quantization or "none"}
    ids = iter(range(10**9))
    for batch in args.batches:
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"Describe item number {i} as JSON with a "
                                              "name, tags and a score."}], add_generation_prompt=True,
                                           tokenize=True) for i in range(batch)]
        if hasattr(prompts[0], "input_ids"):
            prompts = [p.input_ids for p in prompts]
        prompts = [list(p) for p in prompts]

        host = {m: {k: [] for k in HOST_KEYS} for m in modes}
        parked: dict[str, list[float]] = {}  # share of structured steps whose sampling ran parked on the gate
        gated: dict[str, list[float]] = {}  # share of structured steps whose sampling waited on the device
        last_tokens: dict[str, list] = {}  # mode -> each request's output tokens in its last run (greedy: equal)
        thread_cpu: dict[str, list[dict[str, float]]] = {}  # mode -> per run: thread name -> CPU s per step
        texts: dict[str, list[int]] = {}
        stacks: dict[str, dict] = {}  # --stack-sample: mode -> benchmarks/stack_sampler.py's report

        def run(mode: str, prompts=prompts, batch=batch, host=host, texts=texts, parked=parked,
                thread_cpu=thread_cpu, gated=gated, last_tokens=last_tokens, sampler=None) -> list[float]:
            params_so, on, fill_first, own_maxlength, interval, knobs = modes[mode]
            apply_knobs(core, knobs, on, bool(args.async_modes), saved)
            executor_cls.execute_structured = serial if fill_first else overlapped
            xgb.bounded_strings_as_patterns = (lambda schema: schema) if own_maxlength else rewrite
            params = SamplingParams(temperature=0, max_tokens=args.steps + 1, ignore_eos=params_so is None,
                                    structured_outputs=params_so)
            reqs = [EngineCoreRequest(f"b{next(ids)}", p, params, time.time(), eos_token_id=tok.eos_token_id)
                    for p in prompts]
            stats = core.structured.stats
            for k in stats:
                stats[k] = 0
            timers = core.step_timers
            timers0 = timers.as_dict()
            texts.clear()
            cpu0 = thread_cpu_s()
            default_interval = sys.getswitchinterval()
            if interval:
                sys.setswitchinterval(interval)
            try:
                times = timed_steps(core, reqs, batch, texts, sampler)
            finally:
                sys.setswitchinterval(default_interval)
                executor_cls.execute_structured = overlapped
                xgb.bounded_strings_as_patterns = rewrite
                restore(core, saved)
            last_tokens[mode] = [texts.get(r.request_id) for r in reqs]  # the same prompts in every mode
            if stats["steps"]:
                for k in HOST_KEYS[:-2]:
                    host[mode][k].append(stats[k] / stats["steps"])
                parked.setdefault(mode, []).append(stats.get("parked", 0) / stats["steps"])
                gated.setdefault(mode, []).append(stats.get("device_gated", 0) / stats["steps"])
            t1 = timers.as_dict()  # the engine core thread's own timers (whole run, prefill steps included)
            n = t1["steps"] - timers0["steps"]
            if n:  # CPU time of each thread per step (whole run): where the host work of a step really runs
                thread_cpu.setdefault(mode, []).append({name: (v - cpu0.get(name, 0.0)) / n
                                                        for name, v in thread_cpu_s().items()})
                host[mode]["core_host_s"].append((t1["host_s"] - timers0["host_s"]) / n)
                host[mode]["core_wait_s"].append((t1["wait_s"] - timers0["wait_s"]) / n)
            return times

        for mode in modes:  # warm: compile once, caches and buffers filled
            run(mode)
        times = {m: [] for m in modes}
        samples = {}
        for _ in range(args.repeats):
            for mode in modes:
                times[mode] += run(mode)
                if modes[mode][0] is not None and mode not in samples and args.show_outputs:
                    samples[mode] = [tok.decode(t) for t in list(texts.values())[:args.show_outputs]]
                print(f"batch {batch} {mode}: {len(times[mode])} steps, median "
                      f"{statistics.median(times[mode]) * 1e3:.2f} ms", flush=True)
        for m in args.stack_sample or []:  # more, untimed runs of each mode under the stack sampler
            if m in modes:
                from stack_sampler import StackSampler

                with StackSampler() as sampler:  # full-batch decode steps only (no prefill, tail or /proc reads)
                    sampler.enabled = False
                    for _ in range(args.stack_runs):  # (a 24-step GPU run is ~50 ms: ~100 samples)
                        run(m, sampler=sampler)
                stacks[m] = sampler.report(top=25)
        calls = {}
        for m in args.count_calls or []:  # one more, untimed run of each mode: calls per full-batch step, by thread
            if m in modes:
                counter.counts.clear()
                with counter:
                    steps = len(run(m, sampler=counter))
                calls[m] = counter.report(steps, top=80)
        med = {m: statistics.median(t) for m, t in times.items() if t}
        row = {f"{m}_ms_per_step": round(v * 1e3, 3) for m, v in med.items()}
        row.update({f"{m}_steps": len(t) for m, t in times.items()})
        for m, (params_so, on, _, _, interval, knobs) in modes.items():
            base = baseline(m, on, interval, knobs)
            if params_so is not None and m in med and base in med:
                row[f"{m}_overhead_pct"] = round((med[m] / med[base] - 1) * 100, 1)
        for m, (params_so, on, _, _, _, _) in modes.items():  # host time per step the forward did not hide
            h = {k: statistics.median(v) for k, v in host[m].items() if v}
            if h and params_so is None:  # the free modes: only the core thread's timers
                row[f"{m}_host_ms_per_step"] = {k[:-2]: round(v * 1e3, 3) for k, v in h.items()}
            if h and params_so is not None:
                row[f"{m}_host_ms_per_step"] = {k[:-2]: round(v * 1e3, 3) for k, v in h.items()}
                if not on:  # under async, prepare/accept/fill run while a forward runs: no such sum applies
                    exposed = h["prepare_s"] + h["wait_s"] + h["apply_s"] + h["accept_s"]
                    row[f"{m}_exposed_host_ms_per_step"] = round(exposed * 1e3, 3)
                    row[f"{m}_exposed_pct_of_free_step"] = round(exposed / med["free"] * 100, 1)
        for m, v in parked.items():
            row[f"{m}_parked_frac"] = round(statistics.mean(v), 3)
        for m, v in gated.items():
            row[f"{m}_device_gated_frac"] = round(statistics.mean(v), 3)
        ref = next((m for m in ("json_async_park", "json_async", "overlap", "json_async_devgate") if m in last_tokens),
                   None)
        for m, toks in last_tokens.items():  # greedy, same prompts: a path that changes a token is wrong
            if (modes[m][0] is not None and ref is not None and m != ref and modes[m][0] is modes[ref][0]
                    and not modes[m][5].get("gate_only")):  # (gate_only: unconstrained text by design)
                row[f"{m}_tokens_equal_{ref}"] = toks == last_tokens[ref]
        for m, runs in thread_cpu.items():  # timed runs only (the first is the warm-up: compiles, first buffers)
            timed = runs[1:] or runs
            names = {k for r in timed for k in r}
            cpu = {k: round(statistics.median(r.get(k, 0.0) for r in timed) * 1e3, 3) for k in names}
            row[f"{m}_thread_cpu_ms_per_step"] = {k: v for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v >= 0.01}
        cgm = sys.modules.get("octavo.plugins.platforms.cuda_grammar_mask")  # (loaded by a CUDA engine only)
        if cgm is not None:  # session 12: the wait + apply graph's replays, all modes together (0: never taken)
            row["grammar_graph_replays"] = cgm.apply_bitmask_.gated_graphs.replays
            row["grammar_graph_failed"] = list(grammar_device_gate._GRAPH_FAILED)
        if samples:
            row["sample_outputs"] = samples
        if stacks:
            row["stack_samples"] = stacks
        if calls:
            row["call_counts"] = calls
        result[f"batch_{batch}"] = row
        if args.json:  # partial results survive a time limit that cuts the next batch short
            with open(args.json, "w") as f:
                json.dump({"backend": args.backend, "partial": True, "decode": result}, f, indent=2)
    if args.async_modes:
        from octavo.core.async_engine import set_async_scheduling

        set_async_scheduling(core, False)
    llm.llm_engine.shutdown()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="xgrammar")
    ap.add_argument("--steps", type=int, default=24, help="decode steps per run (max_tokens - 1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2 GGUF")
    ap.add_argument("--tokenizer", default=None, help="a tokenizer for a --load-format dummy model dir")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--load-format", dest="load_format", default=None, help="e.g. dummy (random weights)")
    ap.add_argument("--compare-maxlength", dest="compare_maxlength", action="store_true",
                    help="also time xgrammar's own maxLength form (before the regex rewrite) as overlap_maxlength")
    ap.add_argument("--async-modes", dest="async_modes", nargs="+", choices=["off", "on"], default=None,
                    help="with 'on': also free_async / json_async (async scheduling switched on in the same engine)")
    ap.add_argument("--modes", nargs="+", default=None, help="run only these modes (free and free_async always run)")
    ap.add_argument("--switch-interval", dest="switch_interval", type=float, default=None,
                    help="with --async-modes on: also free_async_si / json_async_si under sys.setswitchinterval(S)")
    ap.add_argument("--show-outputs", dest="show_outputs", type=int, default=0,
                    help="record this many decoded outputs of each constrained mode (what the walk looked like)")
    ap.add_argument("--wait-events", dest="wait_events", choices=["on", "off"], default="on",
                    help="time each device wait with two device events (default on; off: no benchmark-only work)")
    ap.add_argument("--stack-runs", dest="stack_runs", type=int, default=1,
                    help="runs of each --stack-sample mode under the sampler (default 1)")
    ap.add_argument("--stack-sample", dest="stack_sample", nargs="+", default=None,
                    help="after the timed runs, one untimed run of each of these modes under a wall-clock stack "
                         "sampler (benchmarks/stack_sampler.py): what each thread does, in the JSON")
    ap.add_argument("--count-calls", dest="count_calls", nargs="+", default=None,
                    help="after the timed runs, one untimed run of each of these modes counting every thread's Python "
                         "and C calls per full-batch step (benchmarks/call_counter.py; on Python < 3.12 every timing "
                         "of this process is slowed by the hook)")
    ap.add_argument("--host-gate", dest="host_gate", action="store_true",
                    help="CPU: the device gate with a host stand-in for the device's wait (the step thread spins "
                         "until the word opens, as tests/structured/test_device_gate.py), so the device-gate modes "
                         "run their GPU structure on a CPU")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()
    out = {"backend": args.backend}
    if not args.skip_compile:
        out["compile_50_properties"] = bench_compile(args)
        print(json.dumps(out, indent=2), flush=True)
    if not args.skip_decode:
        out["decode"] = bench_decode(args)
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
