"""Several engine modes of JSON-schema decoding (and unconstrained decoding) in ONE rotation, one engine (session 16).

Why: the paired A/Bs of benchmarks/structured_knob_ab.py run one pair after another, so "free vs json" and "free vs
chain" come from different minutes of a drifting host (session 16 call 2, one H100: free -> json -10 % and free ->
chain +11 % at 135M while chain vs json was +3 %). Here every round runs every mode back to back, in order on even
rounds and reversed on odd ones (ABC CBA), so each round gives a ratio for every pair of modes from adjacent runs.

    python benchmarks/structured_rotate.py --mode free=free --mode json=grammar_chain.CHAIN=false \\
        --mode chain=grammar_chain.CHAIN=true [--mode NAME=MOD.ATTR=JSON[,MOD.ATTR=JSON]] \\
        --model DIR --load-format dummy --device cuda --dtype bfloat16 [--batches 32] [--rounds 16] [--steps 48]
        [--host-gate] [--json OUT]

A mode ``free`` runs the same prompts unconstrained (``ignore_eos``: the same number of steps); ``free,KNOB=JSON``
too, with knobs (e.g. benchmarks/structured_burn.py's ``burn.CORE_US``: diagnostic Python on a thread). Knobs as in
structured_knob_ab.py (``octavo.core.MODULE.ATTR`` or ``plugins.X.Y.ATTR``), put back after each run. Reported per
batch: each mode's median ms per full-batch step and host ms per step (the manager's keys, ``chained_frac``), every
pair's median of round ratios with p25..p75, and whether the greedy tokens of the constrained modes are equal. The JSON
is rewritten after every round (a run cut by its time bound keeps the rounds it finished).
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
from structured_knob_ab import _knobs  # noqa: E402


def _parse(spec: str) -> tuple[str, list | None, bool]:
    """(name, knob sets, free): ``NAME=free[,KNOB=JSON...]`` runs the requests unconstrained; a knob ``burn.X`` is
    benchmarks/structured_burn.py's (diagnostic Python spun on a thread each step)."""
    name, _, rest = spec.partition("=")
    items = rest.split(",")
    free = items[0] == "free"
    sets = []
    for item in items[1:] if free else items:
        knob, _, value = item.rpartition("=")
        if knob.startswith("burn."):
            import structured_burn

            attr = knob.split(".", 1)[1]
            sets.append((structured_burn, attr, getattr(structured_burn, attr), json.loads(value)))
            continue
        (mod, attr, dflt), = _knobs(knob)
        sets.append((mod, attr, dflt, json.loads(value)))
    return name, sets, free


def _q(xs: list[float]) -> list[float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return [round((q[0] - 1) * 100, 2), round((q[2] - 1) * 100, 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", action="append", required=True, help="NAME=free or NAME=MOD.ATTR=JSON[,...]")
    ap.add_argument("--batches", type=int, nargs="+", default=[32])
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--steps", type=int, default=48, help="decode steps per run (max_tokens - 1)")
    for name in ("model", "tokenizer", "device", "dtype", "quantization"):
        ap.add_argument(f"--{name}", default=None)
    ap.add_argument("--load-format", dest="load_format", default=None)
    ap.add_argument("--host-gate", dest="host_gate", action="store_true")
    ap.add_argument("--sections", action="store_true", help="each thread's CPU by section of a step "
                    "(benchmarks/structured_sections.py, session 17)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    modes = [_parse(s) for s in args.mode]

    from octavo import LLM, SamplingParams
    from octavo.core.async_engine import set_async_scheduling
    from octavo.core.messages import EngineCoreRequest
    from octavo.structured_outputs import StructuredOutputsParams

    kw = {"max_model_len": 512, "max_num_seqs": max(args.batches), "enable_prefix_caching": False,
          "async_scheduling": False}
    kw.update({k: getattr(args, k) for k in ("model", "tokenizer", "device", "quantization", "dtype", "load_format")
               if getattr(args, k)})
    llm = LLM(**kw)
    engine, core = llm.llm_engine, llm.llm_engine.core
    if args.host_gate:
        from structured_hostgate import install_host_gate

        install_host_gate(core)
    set_async_scheduling(core, True)
    tok = engine.tokenizer
    so = StructuredOutputsParams(json=SCHEMA)
    json_params = SamplingParams(temperature=0, max_tokens=args.steps + 1, structured_outputs=so)
    free_params = SamplingParams(temperature=0, max_tokens=args.steps + 1, ignore_eos=True)
    ids = iter(range(10**9))
    out = {"modes": args.mode, "device": str(core.model_info.device),
           "loadavg_start": open("/proc/loadavg").read().split()[:3], "cpus": len(os.sched_getaffinity(0))}
    try:  # (a CPU quota: "max 100000" is none)
        out["cgroup_cpu_max"] = open("/sys/fs/cgroup/cpu.max").read().strip()
    except OSError:
        pass

    # the runner's wait + apply graphs (CUDA): replays a step, of them lean / driver-launched (whether a mode's graph
    # lever acted), lean replays that set the step word
    graphs = getattr(getattr(core.executor.driver.runner, "grammar_apply", None), "gated_graphs", None)
    gkeys = ("replays", "lean_replays", "direct", "lean_sets")
    watched = ("MainThread", "octavo-step", "os:python", "os:cuda-EvtHandlr")  # core, runner, the shim's C threads

    if any(k.startswith("burn.") or ",burn." in k for k in args.mode):
        import structured_burn

        structured_burn.install(core)

    sections = None
    if args.sections:
        import structured_sections as sections

        sections.install(core)

    def run(sets, prompts, batch, free):
        for mod, attr, _, value in sets:
            setattr(mod, attr, value)
        stats = core.structured.stats
        for k in stats:
            stats[k] = 0
        g0 = [getattr(graphs, k, 0) for k in gkeys]
        cpu0, rq0 = thread_cpu_s(), thread_cpu_s(1)
        if sections is not None:
            sections.reset()
        reqs = [EngineCoreRequest(f"r{next(ids)}", p, free_params if free else json_params, time.time(),
                                  eos_token_id=tok.eos_token_id) for p in prompts]
        texts: dict = {}
        try:
            times = timed_steps(core, reqs, batch, texts)
        finally:
            for mod, attr, dflt, _ in sets:
                setattr(mod, attr, dflt)
        n = stats["steps"]
        host = {k[:-2]: stats[k] / n * 1e3 for k in HOST_KEYS[:-2]} if n else {}
        # each thread's CPU ms and run-queue wait ms (runnable, no CPU free) over the whole run, per full-batch step
        cpu1, rq1 = thread_cpu_s(), thread_cpu_s(1)
        m = max(1, len(times))
        threads = {f"cpu:{k}": (v - cpu0.get(k, 0.0)) / m * 1e3 for k, v in cpu1.items() if k in watched}
        threads.update({f"rq:{k}": (v - rq0.get(k, 0.0)) / m * 1e3 for k, v in rq1.items() if k in watched})
        if sections is not None:
            threads.update({f"sec:{k}": v / m * 1e3 for k, v in sorted(sections.take().items())})
        if n:
            host["chained_frac"] = stats["chained"] / n
            host.update({f"graph_{k}": (getattr(graphs, k, 0) - v) / n for k, v in zip(gkeys, g0)})
        return times, {**host, **threads}, [texts.get(r.request_id) for r in reqs]

    for batch in args.batches:
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"Describe item number {i} as JSON with a "
                                             "name, tags and a score."}], add_generation_prompt=True, tokenize=True)
                   for i in range(batch)]
        prompts = [list(getattr(p, "input_ids", p)) for p in prompts]
        for _, sets, free in modes:  # warm
            run(sets, prompts, batch, free)
        meds = {name: [] for name, _, _ in modes}
        hosts = {name: [] for name, _, _ in modes}
        toks: dict = {}
        for r in range(args.rounds):
            for name, sets, free in (modes if r % 2 == 0 else modes[::-1]):
                times, host, tk = run(sets, prompts, batch, free)
                meds[name].append(statistics.median(times) if times else float("nan"))
                hosts[name].append(host)
                if not free:
                    toks[name] = tk
            print(f"batch {batch} round {r}: " + ", ".join(f"{n} {meds[n][-1] * 1e3:.3f}" for n, _, _ in modes),
                  flush=True)
            names = [n for n, _, _ in modes]
            res = {"ms_per_step": {n: round(statistics.median(meds[n]) * 1e3, 3) for n in names},
                   "host_ms_per_step": {n: {k: round(statistics.median(h.get(k, 0.0) for h in hosts[n]), 3)
                                            for k in hosts[n][-1]} for n in names if hosts[n] and hosts[n][0]},
                   "pairs": {}, "rounds": r + 1,
                   "tokens_equal": len({json.dumps(t) for t in toks.values()}) <= 1}
            for i, a in enumerate(names):
                for b in names[i + 1:]:
                    ratios = [y / x for x, y in zip(meds[a], meds[b])]
                    res["pairs"][f"{b}_vs_{a}"] = {"pct_median": round((statistics.median(ratios) - 1) * 100, 2),
                                                   "p25_p75": _q(ratios),
                                                   "per_round": [round((x - 1) * 100, 1) for x in ratios]}
            out[f"batch_{batch}"] = res
            out["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=2)
        print(json.dumps({k: v for k, v in out[f"batch_{batch}"].items() if k != "host_ms_per_step"}), flush=True)
    set_async_scheduling(core, False)
    engine.shutdown()


if __name__ == "__main__":
    main()
