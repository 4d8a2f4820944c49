"""Grammar compile time for a 50-property schema (issue 11's "Done when"): front-end validation, the tokenizer-
specific compile uncached (a fresh backend, so no library cache either) and cached (a second request with the same
schema: the engine core's cache by spec); plus the host bitmask fill of 1 and 32 rows and the logits mask apply
alone. Run through ``python benchmarks/structured_outputs.py`` (without ``--skip-compile``).
"""

from __future__ import annotations

import statistics
import time

from structured_common import SCHEMA, schema_50


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
