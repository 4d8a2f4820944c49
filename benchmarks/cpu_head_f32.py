"""The packed bf16 LM head's float32 output vs bf16 output + ``.float()`` (issue 18, session 11 engineer cpu2).

Why: ``compute_logits`` hands float32 logits; the packed head (``cpu_packed_linear.PackedLogitsMethod``) now
asks ``cpu_bf16_gemm`` for float32 holding the bf16 values, so the ``.float()`` pass over the [rows, vocab]
logits disappears. This times both, alternating in one process, at 1 and 2 threads (SmolLM2's head shape,
64 rows), after checking they are the same bits. On a shared machine run it boosted (docs/performance.md):

    python benchmarks/cpu_head_f32.py [--rows 64] [--pairs 60]
"""

import argparse
import statistics
import time

import torch

from octavo.plugins.platforms import cpu_packed_linear as cpl


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=60)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter((torch.randn(49152, 576, generator=g) / 24).bfloat16(), requires_grad=False)
    head = cpl.PackedLogitsMethod(layer.weight, 64)
    x = torch.randn(args.rows, 576, generator=g).bfloat16()
    runs = {"new": lambda: head.apply(layer, x).float(),  # float32 from the kernel: .float() returns it
            "old": lambda: cpl.packed_linear(head, layer.weight, x, None).float()}  # bf16, then widened
    assert runs["new"]().dtype == torch.float32 and torch.equal(runs["new"](), runs["old"]())
    for threads in (1, 2):
        torch.set_num_threads(threads)
        ms = {"new": [], "old": []}
        for i in range(args.pairs):
            for name in ("new", "old") if i % 2 else ("old", "new"):
                t0 = time.perf_counter()
                runs[name]()
                ms[name].append((time.perf_counter() - t0) * 1e3)
        print(f"threads {threads}: head + float32, median ms: new {statistics.median(ms['new']):.3f}, "
              f"old {statistics.median(ms['old']):.3f}")


if __name__ == "__main__":
    main()
