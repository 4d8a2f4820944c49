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
overhead is against ``free_async``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
    "score": {"type": "number", "minimum": 0, "maximum": 100}}, "required": ["name", "tags", "score"]}


def schema_50() -> dict:
    kinds = [{"type": "integer", "minimum": 0, "maximum": 1000}, {"type": "string", "maxLength": 20},
             {"type": "boolean"}, {"enum": ["a", "b", "c"]}, {"type": "array", "items": {"type": "number"}}]
    props = {f"field_{i:02d}": kinds[i % len(kinds)] for i in range(50)}
    return {"type": "object", "properties": props, "required": list(props)[:25], "additionalProperties": False}


# the structured-output manager's per-step host seconds, then the engine core thread's own (StepTimers: its work
# per step, and under async scheduling the time it blocked waiting for a step's tokens: the slack)
HOST_KEYS = ("prepare_s", "fill_s", "wait_s", "apply_s", "accept_s", "accept_thread_s", "release_s", "start_lag_s",
             "resume_lag_s", "device_wait_s", "core_host_s", "core_wait_s")


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds each thread of this process has run so far, by name (Linux ``/proc/self/task/*/schedstat``, ns
    resolution; Python threads by their ``threading`` name with pool suffixes dropped, others by their OS name:
    torch's OpenMP workers, xgrammar's, CUDA's), summed per name. Empty where /proc has no schedstat."""
    import os
    import re
    import threading

    names = {t.native_id: re.sub(r"_\d+$", "", t.name) for t in threading.enumerate()}
    out: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            name = names.get(int(tid))
            if name is None:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    name = "os:" + re.sub(r"\d+$", "", f.read().strip())
        except (OSError, ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + ns / 1e9
    return out


def timed_steps(core, reqs, full: int, tokens: dict | None = None) -> list[float]:
    """Add ``reqs`` to the engine core, run it dry, return the times of steps where all ``full`` decode
    (and, if ``tokens`` is a dict, collect each request's output token ids into it)."""
    for r in reqs:
        core.add_request(r)
    times = []
    while core.has_unfinished_requests():
        running = sum(1 for r in core.scheduler.running if r.num_output_tokens >= 1)
        t0 = time.perf_counter()
        out = core.step()
        dt = time.perf_counter() - t0
        if running == full:
            times.append(dt)
        if tokens is not None:
            for o in out.outputs:
                tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    return times


def bench_decode(args) -> dict:
    from octavo import LLM, SamplingParams
    from octavo.core import async_gate, grammar_device_gate, grammar_step
    from octavo.core import structured_output as so_mod
    from octavo.core.messages import EngineCoreRequest
    from octavo.structured_outputs import StructuredOutputsParams

    kw = {"max_model_len": 512, "max_num_seqs": max(args.batches), "structured_outputs_backend": args.backend,
          "enable_prefix_caching": False}
    if args.async_modes:  # start synchronous; the "_async" modes switch the idle engine on and back
        kw["async_scheduling"] = False
    for name in ("model", "tokenizer", "device", "quantization", "dtype", "load_format"):
        if getattr(args, name):
            kw[name] = getattr(args, name)
    llm = LLM(**kw)
    engine = llm.llm_engine
    core = engine.core
    executor_cls = type(core.executor)
    overlapped = executor_cls.execute_structured

    def serial(self, batch, grammar):  # fill on this thread first, then the step (same apply path as overlap)
        grammar.wait()
        return self.driver.execute(batch, grammar=grammar)
    tok = engine.tokenizer
    so = StructuredOutputsParams(json=SCHEMA)
    # mode -> (structured outputs, async scheduling on, fill before the step, xgrammar's own maxLength form,
    #          GIL switch interval, engine knobs: grammar_step.INLINE_AFTER_GATE / HANDOFF_WAIT_S, fill threads)
    park_default, early_fill_default, start_wait_default = async_gate.PARK, async_gate.EARLY_FILL, \
        async_gate.FILL_START_WAIT_S
    devgate_default, poolaccept_default = grammar_device_gate.DEVICE_GATE, so_mod.ACCEPT_ON_FILL_THREAD
    grammar_device_gate.TIME_WAIT = True  # device events around each device wait: "device_wait" in the host ms
    dflt = {"inline": grammar_step.INLINE_AFTER_GATE, "handoff": grammar_step.HANDOFF_WAIT_S,
            "threads": core.structured.fill_threads, "kernel": grammar_step.PLATFORM_APPLY, "early": so_mod.EARLY_ACCEPT}
    modes = {"free": (None, False, False, False, None, dflt), "overlap": (so, False, False, False, None, dflt),
             "serial": (so, False, True, False, None, dflt),
             # the core's own apply instead of the platform's (CPU: numpy AND/OR with operands the fill builds,
             # session 5-6; the C pass over the packed words is the default since session 7)
             "overlap_coreapply": (so, False, False, False, None, {**dflt, "kernel": False})}
    if args.backend == "xgrammar" and args.compare_maxlength:
        # xgrammar's own maxLength form (before the regex rewrite): a different schema text, so its own cache key
        modes["overlap_maxlength"] = (StructuredOutputsParams(json={**SCHEMA, "description": "maxLength form"}),
                                      False, False, True, None, dflt)
    if "on" in (args.async_modes or []):
        modes["free_async"] = (None, True, False, False, None, dflt)
        modes["json_async"] = (so, True, False, False, None, dflt)
        # the async variants of session 5's changes: the fill queued on the bitmask thread (session 4's path),
        # inline but no hand-off wait, and inline on one thread (no row split)
        modes["json_async_pool"] = (so, True, False, False, None, {**dflt, "inline": False})
        modes["json_async_nohandoff"] = (so, True, False, False, None, {**dflt, "handoff": 0.0})
        modes["json_async_t1"] = (so, True, False, False, None, {**dflt, "threads": 1})
        # session 8: one native fill call on xgrammar's own 8-thread pool (xgrammar_backend.NATIVE_FILL_THREADS)
        modes["json_async_nt8"] = (so, True, False, False, None, {**dflt, "threads": 1, "native": 8})
        # the pinned rows copied to the device before the apply (session 7), not read by the device directly
        modes["json_async_copy"] = (so, True, False, False, None, {**dflt, "host_read": False})
        modes["json_async_table"] = (so, True, False, False, None, {**dflt, "kernel": False})  # the core's apply
        modes["json_async_late"] = (so, True, False, False, None, {**dflt, "early": False})  # accept after update
        # diagnostic: the whole async grammar path (prepare, gate, accept call, hand-off) with the backend's fill
        # and accept replaced by no-ops (rows all open: nothing applied); the text is then unconstrained
        modes["json_async_gateonly"] = (so, True, False, False, None, {**dflt, "gate_only": True})
        # session 6: the step loop before it (no early launch of N+2 between update(N) and N's outputs, and the
        # runner's thread blocking on the gate instead of parking its sampling); compared with free_async_old
        modes["free_async_old"] = (None, True, False, False, None, {**dflt, "old_loop": True})
        modes["json_async_old"] = (so, True, False, False, None, {**dflt, "old_loop": True})
        # one of the two session-6 changes at a time: early launch without parking, parking without early launch
        modes["json_async_nopark"] = (so, True, False, False, None, {**dflt, "park": False})
        modes["json_async_noearly"] = (so, True, False, False, None, {**dflt, "early_launch": False})
        modes["free_async_noearly"] = (None, True, False, False, None, {**dflt, "early_launch": False})
        # N+1's fill started on the bitmask thread right after N's accept, overlapping update(N) + schedule(N+2)
        modes["json_async_earlyfill"] = (so, True, False, False, None, {**dflt, "early_fill": True})
        modes["json_async_noearlyfill"] = (so, True, False, False, None, {**dflt, "early_fill": False})
        # session 7: without the GIL switch interval the loop can set while a structured step is in flight (on an
        # accelerator; core/async_engine.py GRAMMAR_SWITCH_INTERVAL_S, 0 = off by default since session 7 batch 1)
        modes["json_async_noswitch"] = (so, True, False, False, None, {**dflt, "switch": 0.0})
        # the early fill without the core thread's wait (up to 1 ms) until the bitmask thread is inside the fill
        modes["json_async_nostartwait"] = (so, True, False, False, None, {**dflt, "start_wait": 0.0})
        for us in (50, 100, 200, 500, 1000):  # that switch on at these intervals (json_async_sw50us, ...)
            modes[f"json_async_sw{us}us"] = (so, True, False, False, None, {**dflt, "switch": us * 1e-6})
        # the core thread waits (up to 5 ms) until the step thread queued N+2 before building N's outputs
        modes["free_async_wait"] = (None, True, False, False, None, {**dflt, "launch_wait": 0.005})
        modes["json_async_wait"] = (so, True, False, False, None, {**dflt, "launch_wait": 0.005})
        # experiment: three steps in flight (AsyncStepLoop.depth = 3, not the default): N+2 is scheduled and
        # queued before N's tokens arrive, so the runner's thread launches N+2's forward right after N+1's
        # sampler instead of waiting for the core thread; compared with free_async_d3
        modes["free_async_d3"] = (None, True, False, False, None, {**dflt, "depth": 3})
        modes["json_async_d3"] = (so, True, False, False, None, {**dflt, "depth": 3})
        # session 9: the device gate (core/grammar_device_gate.py): sampling queued behind a device wait on a host
        # word the fill opens, instead of parked on the Python gate; _inline: the fill on the core thread at the
        # accept (no early fill on the bitmask thread); json_async_park: the Python gate (sessions 6-8)
        modes["json_async_devgate"] = (so, True, False, False, None, {**dflt, "devgate": True})
        modes["json_async_devgate_inline"] = (so, True, False, False, None, {**dflt, "devgate": True,
                                                                               "early_fill": False})
        modes["json_async_park"] = (so, True, False, False, None, {**dflt, "devgate": False})
        # the device gate with N's accept moved into the bitmask thread's fill job (structured_output
        # ACCEPT_ON_FILL_THREAD), and with a 0.2 ms GIL switch interval while structured steps are in flight
        modes["json_async_devgate_poolaccept"] = (so, True, False, False, None, {**dflt, "devgate": True,
                                                                                   "poolaccept": True})
        modes["json_async_devgate_sw200us"] = (so, True, False, False, None, {**dflt, "devgate": True,
                                                                                "switch": 200e-6})
        # the device gate with no-op fill and accept (rows all open, nothing constrained): the floor of its structure
        modes["json_async_devgate_gateonly"] = (so, True, False, False, None, {**dflt, "devgate": True,
                                                                                 "gate_only": True})
        # the device gate without the core thread's wait (up to 1 ms) until the bitmask thread is inside the fill
        modes["json_async_devgate_nostartwait"] = (so, True, False, False, None, {**dflt, "devgate": True,
                                                                                    "start_wait": 0.0})
        # session 10: the device gate with three steps in flight: N+2 is scheduled and its forward, wait, apply and
        # sampler are queued before N's tokens reach the host (the runner never parks under the device gate), so
        # the host chain N's tokens -> accept -> fill N+1 -> schedule N+3 has two device steps to hide in, not one
        modes["json_async_devgate_d3"] = (so, True, False, False, None, {**dflt, "devgate": True, "depth": 3})
        if args.switch_interval:  # the same two with a shorter GIL switch interval (sys.setswitchinterval)
            modes["free_async_si"] = (None, True, False, False, args.switch_interval, dflt)
            modes["json_async_si"] = (so, True, False, False, args.switch_interval, dflt)
    if args.modes:
        keep = ("free", "free_async", "free_async_si", *(m.replace("json_", "free_", 1) for m in args.modes
                                                          if m.endswith(("_old", "_noearly", "_d3", "_wait"))))
        modes = {m: v for m, v in modes.items() if m in args.modes or m in keep}
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
                thread_cpu=thread_cpu, gated=gated, last_tokens=last_tokens) -> list[float]:
            params_so, on, fill_first, own_maxlength, interval, knobs = modes[mode]
            if args.async_modes:
                from octavo.core.async_engine import set_async_scheduling

                set_async_scheduling(core, on)
                if on and knobs.get("depth"):
                    core.async_loop.depth = knobs["depth"]
                if on:
                    old = knobs.get("old_loop", False)
                    core.async_loop.early_launch = knobs.get("early_launch", not old)
                    async_gate.PARK = knobs.get("park", not old)
                    async_gate.EARLY_FILL = knobs.get("early_fill", early_fill_default and not old)
                    if "launch_wait" in knobs:
                        core.async_loop.launch_wait_s = knobs["launch_wait"]
                    if "switch" in knobs:  # GIL switch interval while a structured step is in flight (0: off)
                        core.async_loop.grammar_switch_s = knobs["switch"]
                    async_gate.FILL_START_WAIT_S = knobs.get("start_wait", start_wait_default)
            grammar_step.INLINE_AFTER_GATE, grammar_step.HANDOFF_WAIT_S = knobs["inline"], knobs["handoff"]
            grammar_step.PLATFORM_APPLY, so_mod.EARLY_ACCEPT = knobs["kernel"], knobs["early"]
            core.structured.fill_threads = knobs["threads"]
            xgb.NATIVE_FILL_THREADS = knobs.get("native", 1)
            grammar_step.HOST_READ_APPLY = knobs.get("host_read", True)
            grammar_device_gate.DEVICE_GATE = knobs.get("devgate", devgate_default)
            so_mod.ACCEPT_ON_FILL_THREAD = knobs.get("poolaccept", poolaccept_default)
            if knobs.get("gate_only") and params_so is not None:
                backend = core.structured._get_backend()
                backend.fill_bitmasks = lambda ms, bm: bm.fill_(-1)
                backend.accept_tokens = lambda ms, toks: [True] * len(ms)
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
                times = timed_steps(core, reqs, batch, texts)
            finally:
                sys.setswitchinterval(default_interval)
                executor_cls.execute_structured = overlapped
                xgb.bounded_strings_as_patterns = rewrite
                grammar_step.INLINE_AFTER_GATE, grammar_step.HANDOFF_WAIT_S = dflt["inline"], dflt["handoff"]
                grammar_step.PLATFORM_APPLY, so_mod.EARLY_ACCEPT = dflt["kernel"], dflt["early"]
                core.structured.fill_threads = dflt["threads"]
                xgb.NATIVE_FILL_THREADS = 1
                grammar_step.HOST_READ_APPLY = True
                grammar_device_gate.DEVICE_GATE = devgate_default
                so_mod.ACCEPT_ON_FILL_THREAD = poolaccept_default
                async_gate.PARK, async_gate.EARLY_FILL = park_default, early_fill_default
                async_gate.FILL_START_WAIT_S = start_wait_default
                backend = core.structured._backend
                for name in ("fill_bitmasks", "accept_tokens"):  # the gate_only no-ops (instance attributes)
                    if backend is not None and name in vars(backend):
                        delattr(backend, name)
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
                sys.path.insert(0, __file__.rsplit("/", 1)[0])
                from stack_sampler import StackSampler

                with StackSampler() as sampler:
                    for _ in range(args.stack_runs):  # (a 24-step GPU run is ~50 ms: ~100 samples)
                        run(m)
                stacks[m] = sampler.report(top=25)
        med = {m: statistics.median(t) for m, t in times.items() if t}
        row = {f"{m}_ms_per_step": round(v * 1e3, 3) for m, v in med.items()}
        row.update({f"{m}_steps": len(t) for m, t in times.items()})
        for m, (params_so, on, _, _, interval, knobs) in modes.items():
            base = ("free_async_si" if interval else "free_async") if on else "free"
            if on and knobs.get("depth"):
                base = f"free_async_d{knobs['depth']}"
            if on and knobs.get("old_loop"):
                base = "free_async_old"
            if on and knobs.get("early_launch") is False:
                base = "free_async_noearly"
            if on and "launch_wait" in knobs:
                base = "free_async_wait"
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
        if samples:
            row["sample_outputs"] = samples
        if stacks:
            row["stack_samples"] = stacks
        result[f"batch_{batch}"] = row
        if args.json:  # partial results survive a time limit that cuts the next batch short
            with open(args.json, "w") as f:
                json.dump({"backend": args.backend, "partial": True, "decode": result}, f, indent=2)
    if args.async_modes:
        from octavo.core.async_engine import set_async_scheduling

        set_async_scheduling(core, False)
    llm.llm_engine.shutdown()
    return result


def bench_compile(args) -> dict:
    from octavo.config import OctavoSettings
    from octavo.core.loader import load_tokenizer
    from octavo.core.messages import EngineCoreRequest
    from octavo.core.request import Request
    from octavo.core.structured_output import StructuredOutputManager
    from octavo.registry import resolve
    from octavo.sampling_params import SamplingParams
    from octavo.structured_outputs import StructuredOutputsParams

    settings = OctavoSettings.from_kwargs(structured_outputs_backend=args.backend)
    tok = load_tokenizer(settings.model)
    cls = resolve("structured_output_backends", args.backend)
    params = StructuredOutputsParams(json=schema_50())
    t0 = time.perf_counter()
    cls.validate(params)
    t_validate = time.perf_counter() - t0
    uncached = []
    for _ in range(args.repeats):
        backend = cls(tok, 49152)  # fresh: no library-level cache either
        t0 = time.perf_counter()
        backend.compile(params)
        uncached.append(time.perf_counter() - t0)
    mgr = StructuredOutputManager(settings, 49152, [tok.eos_token_id])
    first = Request(EngineCoreRequest("a", [1], SamplingParams(structured_outputs=params), 0.0), 8)
    mgr.add_request(first)
    first.grammar.future.result()
    t0 = time.perf_counter()
    second = Request(EngineCoreRequest("b", [1], SamplingParams(structured_outputs=params), 0.0), 8)
    mgr.add_request(second)
    second.grammar.future.result()
    t_cached = time.perf_counter() - t0
    # host cost per step: fill the bitmask rows of 1 and 32 requests under SCHEMA (what attach_bitmasks does)
    from octavo.core.scheduler import ScheduledRequest
    from octavo.step import ScheduledRequestData

    fill = {}
    for batch in (1, 32):
        reqs = [Request(EngineCoreRequest(f"f{batch}-{i}", [1], SamplingParams(
            structured_outputs=StructuredOutputsParams(json=SCHEMA)), 0.0), 8) for i in range(batch)]
        for r in reqs:
            mgr.add_request(r)
            r.grammar.future.result()

        class Out:
            scheduled = [ScheduledRequest(r, 1, 0, [0]) for r in reqs]

        class Batch:
            scheduled = [ScheduledRequestData(r.request_id, [], 0, [0], True) for r in reqs]

        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            mgr.attach_bitmasks(Out, Batch)
            times.append(time.perf_counter() - t0)
        fill[f"bitmask_fill_ms_batch_{batch}"] = round(statistics.median(times) * 1e3, 3)
        fill[f"bitmask_fill_min_ms_batch_{batch}"] = round(min(times) * 1e3, 3)
    mgr.shutdown()
    import torch

    from octavo.core.grammar_step import apply_packed

    logits = torch.randn(32, 49152)
    packed = torch.randint(-2**31, 2**31 - 1, (32, 1536), dtype=torch.int32)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        apply_packed(logits, list(range(32)), packed)
        times.append(time.perf_counter() - t0)
    fill["mask_apply_ms_batch_32"] = round(statistics.median(times) * 1e3, 3)
    fill["mask_apply_min_ms_batch_32"] = round(min(times) * 1e3, 3)  # the op's own cost on a loaded machine
    # the numpy apply above builds its operands here too (the engine builds them on the fill thread); the CPU
    # platform's C pass (the engine's default on a CPU since session 7) needs none
    from octavo.registry import select_platform

    plat = select_platform(settings)
    kernel = plat.make_grammar_mask_apply() if plat.device_type == "cpu" else None  # (these logits are host ones)
    if kernel is not None:
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            apply_packed(logits, list(range(32)), packed, kernel=kernel)
            times.append(time.perf_counter() - t0)
        fill["mask_apply_platform_ms_batch_32"] = round(statistics.median(times) * 1e3, 3)
        fill["mask_apply_platform_min_ms_batch_32"] = round(min(times) * 1e3, 3)
    return {"validate_ms": round(t_validate * 1e3, 2), "compile_uncached_ms": round(statistics.median(uncached) * 1e3, 2),
            "compile_cached_ms": round(t_cached * 1e3, 3), **fill}


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
    ap.add_argument("--stack-runs", dest="stack_runs", type=int, default=1,
                    help="runs of each --stack-sample mode under the sampler (default 1)")
    ap.add_argument("--stack-sample", dest="stack_sample", nargs="+", default=None,
                    help="after the timed runs, one untimed run of each of these modes under a wall-clock stack "
                         "sampler (benchmarks/stack_sampler.py): what each thread does, in the JSON")
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
