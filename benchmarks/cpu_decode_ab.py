"""Batch-1 decode of the fused CPU stack with the C kernels of another git revision swapped in, alternating rounds.

Why: on a shared 2-vCPU machine two runs minutes apart differ by more than a kernel change, so a before/after of
the batch-1 kernels is measured in ONE process: one engine (``benchmarks/cpu_decode.py``'s ``octavo-fused``),
and per round the int8-activation kernels (``plugins/quant/cpu_int8act_src.py``) and the fused stack
(``plugins/platforms/cpu_fused_decode_src.py``) built from ``--rev``'s sources, then from the working tree's,
then llama.cpp on the same GGUF. The swap replaces the function pointers the fused stack calls and the library
the LM head calls; the sources' C signatures must match (they are checked by ctypes only by name). The greedy
tokens of both builds must be equal (asserted: these changes are speed-only).

    python benchmarks/cpu_decode_ab.py --rev 7d91d9c --threads 2 --tokens 48 --rounds 7
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _source_at(rev: str, path: str) -> str:
    text = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True,
                          cwd=_ROOT).stdout
    ns: dict = {}
    exec(compile(text, f"{rev}:{path}", "exec"), ns)  # the module defines C_SOURCE (it may import octavo)
    return ns["C_SOURCE"]


def libraries(rev: str | None):
    """``(int8act library, fused-stack library)`` built from ``rev`` (None: the working tree's)."""
    from octavo.plugins.platforms import cpu_fused_decode
    from octavo.plugins.quant import cpu_int8act
    from octavo.plugins.quant.cpu_build import compile_shared_library

    if rev is None:
        return cpu_int8act.library(), cpu_fused_decode.library()
    q = ctypes.CDLL(compile_shared_library(_source_at(rev, "plugins/quant/cpu_int8act_src.py"), "octavo_q8act_rev",
                                           cpu_int8act._flags("native")))
    for name, (argtypes, restype) in cpu_int8act._SIGNATURES.items():
        fn = getattr(q, name)
        fn.argtypes, fn.restype = argtypes, restype
    f = ctypes.CDLL(compile_shared_library(_source_at(rev, "plugins/platforms/cpu_fused_decode_src.py"),
                                           "octavo_fused_rev", cpu_fused_decode._FLAGS))
    want = cpu_fused_decode.library().fused_decode_team
    f.fused_decode_team.argtypes, f.fused_decode_team.restype = want.argtypes, want.restype
    return q, f


def install(runner, q, f) -> None:
    from octavo.plugins.quant import cpu_int8act

    cpu_int8act._libs[None] = q  # the LM head's calls
    st, ptr = runner._stack, (lambda fn: ctypes.cast(fn, ctypes.c_void_p).value)
    st.gemm, st.quant, st.q4, st.q8 = ptr(q.qa8_gemm), ptr(q.quant_act), ptr(q.q4a8_gemm_q), ptr(q.q8a8_gemm_q)
    runner.lib = f


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", required=True, help="git revision whose kernel sources are the 'before'")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("OCTAVO_LOG_LEVEL", "warning")
    import cpu_decode

    from octavo.core.loader import default_model_path
    from octavo.plugins.platforms.cpu_fused_decode import CpuFusedDecodeRunner

    model = default_model_path()
    eng = cpu_decode.OctavoEngine(model, "bfloat16", None, False, args.threads, fused=True)
    runner = eng.llm.llm_engine.core.executor.driver.runner.graph_runner
    if not isinstance(runner, CpuFusedDecodeRunner):
        raise SystemExit(f"the engine's step runner is {type(runner).__name__}, not the fused stack")
    builds = {args.rev: libraries(args.rev), "tree": libraries(None)}
    llama = None if args.no_llama else cpu_decode.LlamaCppEngine(model, args.threads)
    prompt = torch.randint(100, 49000, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    eng.decode(prompt, 4)
    if llama:
        llama.decode(prompt, 4)
    ms: dict[str, list[float]] = {n: [] for n in [*builds, *(["llama.cpp"] if llama else [])]}
    toks = {}
    for r in range(args.rounds):
        for name, (q, f) in builds.items():
            install(runner, q, f)
            torch.set_num_threads(args.threads)
            per_tok, toks[name] = eng.decode(prompt, args.tokens)
            ms[name].append(per_tok * 1e3)
        if llama:
            torch.set_num_threads(args.threads)
            ms["llama.cpp"].append(llama.decode(prompt, args.tokens)[0] * 1e3)
        print(f"round {r}: " + "  ".join(f"{n} {v[-1]:.2f}" for n, v in ms.items()) + " ms/token", flush=True)
    install(runner, *builds["tree"])
    if toks[args.rev] != toks["tree"]:
        raise SystemExit("the two builds decoded different tokens")
    med = {n: statistics.median(v) for n, v in ms.items()}
    print("median ms/token: " + "  ".join(f"{n} {v:.2f}" for n, v in med.items()))
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "command": "python benchmarks/cpu_decode_ab.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "ms_per_token_rounds": ms, "ms_per_token_median": med, "tokens_equal": True,
              "loadavg_end": os.getloadavg()}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
