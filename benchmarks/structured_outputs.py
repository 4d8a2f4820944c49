"""Structured-output overhead on the embedded SmolLM2 (CPU by default).

1. Per-token cost of JSON-schema decoding vs unconstrained, at batch 1 and batch 32: the same prompts, greedy,
   ``max_tokens`` each; time per generated token over the whole ``generate`` call, the two modes interleaved
   (A B A B ...) so load drift hits both alike. Reported as the ratio constrained / unconstrained.
2. Grammar compile time for a 50-property schema: front-end validation, the tokenizer-specific compile
   uncached (a fresh backend, so no library cache either), and cached (a second request with the same schema:
   the engine core's cache by spec).

    python benchmarks/structured_outputs.py [--backend xgrammar|guidance] [--max-tokens 48] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
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


def per_token(llm, prompts, params) -> float:
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return elapsed / sum(len(c.token_ids) for o in outs for c in o.outputs)


def bench_decode(args) -> dict:
    from octavo import LLM, SamplingParams
    from octavo.structured_outputs import StructuredOutputsParams

    llm = LLM(max_model_len=512, max_num_seqs=32, structured_outputs_backend=args.backend)
    free = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    constrained = SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                 structured_outputs=StructuredOutputsParams(json=SCHEMA))
    result = {}
    for batch in (1, 32):
        prompts = [f"Describe item number {i} as JSON with a name, tags and a score:" for i in range(batch)]
        per_token(llm, prompts, constrained)  # warm: compile once, caches filled
        a, b = [], []
        for _ in range(args.repeats):
            a.append(per_token(llm, prompts, free))
            b.append(per_token(llm, prompts, constrained))
        fa, fb = statistics.median(a), statistics.median(b)
        result[f"batch_{batch}"] = {"unconstrained_ms_per_token": round(fa * 1e3, 3),
                                    "json_schema_ms_per_token": round(fb * 1e3, 3),
                                    "overhead_pct": round((fb / fa - 1) * 100, 1)}
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
    mgr.shutdown()
    return {"validate_ms": round(t_validate * 1e3, 2), "compile_uncached_ms": round(statistics.median(uncached) * 1e3, 2),
            "compile_cached_ms": round(t_cached * 1e3, 3), **fill}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="xgrammar")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-decode", action="store_true")
    args = ap.parse_args()
    out = {"backend": args.backend, "compile_50_properties": bench_compile(args)}
    if not args.skip_decode:
        out["decode"] = bench_decode(args)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
