"""A/B of one structured-output knob (a module flag) on JSON-schema decoding under async scheduling, one engine.

Why: benchmarks/structured_outputs.py runs its modes in a fixed order every round, so on a loaded machine the mode
that runs last sees a different load (session 13: two modes with the same settings differed by 15 % there). Here
the two values of one knob alternate by run in ABBA order (each value first in half the rounds), the requests and
prompts are the same in every run, and each round gives one paired ratio (B's median step over A's, from adjacent
runs). ``--values X X`` (the same value twice) is the A/A control: the spread of its ratios is this machine's noise.

    python benchmarks/structured_knob_ab.py --knob async_gate.FILL_START_WAIT_S --values 0.001 0 \\
        --model DIR --load-format dummy --device cpu --dtype float32 --host-gate [--batches 32 1] [--rounds 8]
        [--steps 24] [--json OUT]

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--knob", required=True, help="MODULE.ATTR in octavo.core, e.g. async_gate.FILL_START_WAIT_S; "
                    "several, comma-separated, take each value together")
    ap.add_argument("--values", nargs=2, required=True, help="A and B, as JSON (the same twice: the A/A control)")
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
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from octavo import LLM, SamplingParams
    from octavo.core.async_engine import set_async_scheduling
    from octavo.core.messages import EngineCoreRequest
    from octavo.structured_outputs import StructuredOutputsParams

    knobs = []  # (module, attribute, engine default); several (comma-separated) take the same value together
    for name in args.knob.split(","):
        mod_name, attr = name.rsplit(".", 1)  # (a module of octavo.core, or plugins.X.Y: octavo.plugins.X.Y)
        mod = importlib.import_module(f"octavo.{mod_name}" if mod_name.startswith("plugins.") else f"octavo.core.{mod_name}")
        if not hasattr(mod, attr):
            raise SystemExit(f"--knob {name}: {mod.__name__} has no {attr}")
        knobs.append((mod, attr, getattr(mod, attr)))
    default = knobs[0][2] if len(knobs) == 1 else [k[2] for k in knobs]
    values = [json.loads(v) for v in args.values]
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
    set_async_scheduling(core, True)
    tok = engine.tokenizer
    params = SamplingParams(temperature=0, max_tokens=args.steps + 1, structured_outputs=StructuredOutputsParams(json=SCHEMA))
    ids = iter(range(10**9))
    result = {"knob": args.knob, "values": values, "engine_default": default, "device": str(core.model_info.device),
              "loadavg_start": open("/proc/loadavg").read().split()[:3]}
    for batch in args.batches:
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"Describe item number {i} as JSON with a "
                                             "name, tags and a score."}], add_generation_prompt=True, tokenize=True)
                   for i in range(batch)]
        prompts = [list(getattr(p, "input_ids", p)) for p in prompts]  # (a BatchEncoding or the ids)

        def run(v, prompts=prompts, batch=batch):
            for mod, attr, _ in knobs:
                setattr(mod, attr, v)
            stats = core.structured.stats
            for k in stats:
                stats[k] = 0
            reqs = [EngineCoreRequest(f"k{next(ids)}", p, params, time.time(), eos_token_id=tok.eos_token_id)
                    for p in prompts]
            texts: dict = {}
            try:
                times = timed_steps(core, reqs, batch, texts)
            finally:
                for mod, attr, dflt in knobs:
                    setattr(mod, attr, dflt)
            host = {k[:-2]: stats[k] / stats["steps"] for k in HOST_KEYS[:-2] if stats["steps"]}
            return times, host, [texts.get(r.request_id) for r in reqs]

        run(values[0]), run(values[1])  # warm
        steps = {0: [], 1: []}
        hosts = {0: [], 1: []}
        toks = {}
        ratios = []
        for r in range(args.rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)  # ABBA over rounds: AB, BA, AB, ...
            med = {}
            for i in order:
                times, host, tk = run(values[i])
                steps[i] += times
                hosts[i].append(host)
                toks[i] = tk
                med[i] = statistics.median(times) if times else float("nan")
            ratios.append(med[1] / med[0])
            print(f"batch {batch} round {r}: A {med[0] * 1e3:.2f} ms, B {med[1] * 1e3:.2f} ms, B/A {ratios[-1]:.3f}",
                  flush=True)
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        result[f"batch_{batch}"] = {
            "A_ms_per_step": round(statistics.median(steps[0]) * 1e3, 3),
            "B_ms_per_step": round(statistics.median(steps[1]) * 1e3, 3),
            "B_vs_A_pct_median_of_round_ratios": round((statistics.median(ratios) - 1) * 100, 2),
            "B_vs_A_pct_round_p25_p75": [round((q[0] - 1) * 100, 2), round((q[2] - 1) * 100, 2)],
            "B_vs_A_pct_per_round": [round((x - 1) * 100, 2) for x in ratios],
            "steps_per_value": len(steps[0]),
            "A_host_ms_per_step": {k: round(statistics.median(h[k] for h in hosts[0]) * 1e3, 3) for k in hosts[0][0]},
            "B_host_ms_per_step": {k: round(statistics.median(h[k] for h in hosts[1]) * 1e3, 3) for k in hosts[1][0]},
            "tokens_equal": toks[0] == toks[1],
        }
        print(json.dumps(result[f"batch_{batch}"]), flush=True)
    result["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    set_async_scheduling(core, False)
    engine.shutdown()
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
