"""A/B of one structured-output knob (a module flag) on JSON-schema decoding under async scheduling, one engine.

Why: benchmarks/structured_outputs.py runs its modes in a fixed order every round, so on a loaded machine the mode
that runs last sees a different load (session 13: two modes with the same settings differed by 15 % there). Here
the two values of one knob alternate by run in ABBA order (each value first in half the rounds), the requests and
prompts are the same in every run, and each round gives one paired ratio (B's median step over A's, from adjacent
runs). ``--values X X`` (the same value twice) is the A/A control: the spread of its ratios is this machine's noise.

    python benchmarks/structured_knob_ab.py --knob async_gate.FILL_START_WAIT_S --values 0.001 0 \\
        --model DIR --load-format dummy --device cpu --dtype float32 --host-gate [--batches 32 1] [--rounds 8]
        [--steps 24] [--json OUT]

``--a-free`` (session 16): A runs the same prompts unconstrained (no structured outputs; the knob keeps its engine
default there), so B vs A is the JSON overhead itself, paired (tokens are then not compared).

``--knob`` names ``MODULE.ATTR`` of ``octavo.core`` (e.g. ``async_gate.FILL_START_WAIT_S``,
``structured_output.YIELD_AFTER_RELEASE``); values are JSON (``0``, ``0.001``, ``true``). ``--host-gate``: the
device gate's structure on a CPU engine (benchmarks/structured_hostgate.py). Per value: the median
wall ms per full-batch decode step, the manager's host ms per step (release, accept, start lag, ...), and whether
the greedy tokens equal the other value's (a knob that changes a token is wrong).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules below, run as a script
from structured_common import HOST_KEYS, SCHEMA, timed_steps  # noqa: E402


def _knobs(spec: str) -> list[tuple]:
    """(module, attribute, engine default) of each comma-separated ``MODULE.ATTR`` (octavo.core.MODULE, or
    plugins.X.Y: octavo.plugins.X.Y); several take the same value together."""
    knobs = []
    for name in spec.split(","):
        mod_name, attr = name.rsplit(".", 1)
        mod = importlib.import_module(f"octavo.{mod_name}" if mod_name.startswith("plugins.") else f"octavo.core.{mod_name}")
        if not hasattr(mod, attr):
            raise SystemExit(f"--knob {name}: {mod.__name__} has no {attr}")
        knobs.append((mod, attr, getattr(mod, attr)))
    return knobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--knob", default=None, help="MODULE.ATTR in octavo.core, e.g. async_gate.FILL_START_WAIT_S; "
                    "several, comma-separated, take each value together")
    ap.add_argument("--values", nargs=2, default=None, help="A and B, as JSON (the same twice: the A/A control)")
    ap.add_argument("--pair", nargs=4, action="append", default=[], metavar=("LABEL", "KNOB", "A", "B"),
                    help="session 16: several A/Bs in one engine (one after the other, each paired); A 'free': the "
                         "same requests unconstrained, the knob at B's value for B")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="MODULE.ATTR=JSON",
                    help="a knob held at this value in every run of every pair (e.g. grammar_chain.CHAIN=true)")
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 1])
    ap.add_argument("--rounds", type=int, default=8, help="ABBA rounds per batch size (2 runs each)")
    ap.add_argument("--steps", type=int, default=24, help="decode steps per run (max_tokens - 1)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--load-format", dest="load_format", default=None)
    ap.add_argument("--host-gate", dest="host_gate", action="store_true")
    ap.add_argument("--a-free", dest="a_free", action="store_true", help="A: the same requests unconstrained")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    pairs = [tuple(p) for p in args.pair]
    if args.knob:
        if not args.values:
            raise SystemExit("--knob needs --values A B")
        pairs.insert(0, ("ab", args.knob, "free" if args.a_free else args.values[0], args.values[1]))
    if not pairs:
        raise SystemExit("give --knob K --values A B, or --pair LABEL K A B (repeatable)")

    from octavo import LLM

    kw = {"max_model_len": 512, "max_num_seqs": max(args.batches), "enable_prefix_caching": False,
          "async_scheduling": False}
    for name in ("model", "tokenizer", "device", "quantization", "dtype", "load_format"):
        if getattr(args, name):
            kw[name] = getattr(args, name)
    llm = LLM(**kw)
    engine = llm.llm_engine
    core = engine.core
    if args.host_gate:
        from structured_hostgate import install_host_gate

        install_host_gate(core)
    from octavo.core.async_engine import set_async_scheduling

    set_async_scheduling(core, True)
    for spec in args.sets:  # (held for the whole run: each pair's knob is put back to this afterwards)
        name, value = spec.split("=", 1)
        (mod, attr, _), = _knobs(name)
        setattr(mod, attr, json.loads(value))
    out = {"device": str(core.model_info.device), "set": args.sets, "loadavg_start": open("/proc/loadavg").read().split()[:3]}
    ids = iter(range(10**9))
    for label, knob, a, b in pairs:
        res = _pair(core, engine.tokenizer, args, _knobs(knob), a, b, ids)
        res["knob"] = knob
        out[label] = res
        if len(pairs) == 1:  # (the session-15 layout: one A/B at the top level)
            out.update(res)
            del out[label]
        if args.json:  # (after each pair: a run cut by its time bound keeps the pairs it finished)
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
    out["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    set_async_scheduling(core, False)
    engine.shutdown()
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


def _pair(core, tok, args, knobs, a: str, b: str, ids) -> dict:
    """One A/B (``a`` 'free': unconstrained requests) over ``args.batches``, ``args.rounds`` ABBA rounds each."""
    from octavo import SamplingParams
    from octavo.core.messages import EngineCoreRequest
    from octavo.structured_outputs import StructuredOutputsParams

    a_free = a == "free"
    values = [json.loads(b if a_free else a), json.loads(b)]
    params = SamplingParams(temperature=0, max_tokens=args.steps + 1, structured_outputs=StructuredOutputsParams(json=SCHEMA))
    # (A unconstrained: no stop on EOS either, so both sides decode the same number of steps)
    free = SamplingParams(temperature=0, max_tokens=args.steps + 1, ignore_eos=True)
    result = {"values": ["free" if a_free else values[0], values[1]], "a_free": a_free,
              "engine_default": knobs[0][2] if len(knobs) == 1 else [k[2] for k in knobs]}
    for batch in args.batches:
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"Describe item number {i} as JSON with a "
                                             "name, tags and a score."}], add_generation_prompt=True, tokenize=True)
                   for i in range(batch)]
        prompts = [list(getattr(p, "input_ids", p)) for p in prompts]  # (a BatchEncoding or the ids)

        def run(v, prompts=prompts, batch=batch, unconstrained=False):
            for mod, attr, _ in knobs:
                setattr(mod, attr, v)
            stats = core.structured.stats
            for k in stats:
                stats[k] = 0
            reqs = [EngineCoreRequest(f"k{next(ids)}", p, free if unconstrained else params, time.time(),
                                      eos_token_id=tok.eos_token_id) for p in prompts]
            texts: dict = {}
            try:
                times = timed_steps(core, reqs, batch, texts)
            finally:
                for mod, attr, dflt in knobs:
                    setattr(mod, attr, dflt)
            host = {k[:-2]: stats[k] / stats["steps"] for k in HOST_KEYS[:-2] if stats["steps"]}
            if stats["steps"]:  # (session 16: the steps whose accept + fill the runner's chained job took)
                host["chained_frac"] = stats["chained"] / stats["steps"] * 1e-3  # (shown x1000 as the ms are)
            return times, host, [texts.get(r.request_id) for r in reqs]

        run(values[0], unconstrained=a_free), run(values[1])  # warm
        steps, hosts, toks, ratios = {0: [], 1: []}, {0: [], 1: []}, {}, []
        for r in range(args.rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)  # ABBA over rounds: AB, BA, AB, ...
            med = {}
            for i in order:
                times, host, tk = run(values[i], unconstrained=a_free and i == 0)
                steps[i] += times
                hosts[i].append(host)
                toks[i] = tk
                med[i] = statistics.median(times) if times else float("nan")
            ratios.append(med[1] / med[0])
            print(f"batch {batch} round {r}: A {med[0] * 1e3:.2f} ms, B {med[1] * 1e3:.2f} ms, B/A {ratios[-1]:.3f}",
                  flush=True)
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3

        def host_ms(hs):
            return {k: round(statistics.median(h[k] for h in hs) * 1e3, 3) for k in hs[0]} if hs and hs[0] else {}

        result[f"batch_{batch}"] = {
            "A_ms_per_step": round(statistics.median(steps[0]) * 1e3, 3),
            "B_ms_per_step": round(statistics.median(steps[1]) * 1e3, 3),
            "B_vs_A_pct_median_of_round_ratios": round((statistics.median(ratios) - 1) * 100, 2),
            "B_vs_A_pct_round_p25_p75": [round((q[0] - 1) * 100, 2), round((q[2] - 1) * 100, 2)],
            "B_vs_A_pct_per_round": [round((x - 1) * 100, 2) for x in ratios],
            "steps_per_value": len(steps[0]),
            "A_host_ms_per_step": host_ms(hosts[0]),
            "B_host_ms_per_step": host_ms(hosts[1]),
            "tokens_equal": None if a_free else toks[0] == toks[1],
        }
        print(json.dumps(result[f"batch_{batch}"]), flush=True)
    return result


if __name__ == "__main__":
    main()
