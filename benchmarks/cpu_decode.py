"""Batch-1 decode of the embedded model, side by side in one process: octavo (eager / compiled), transformers,
llama.cpp (``llama-cpp-python``, when installed).

Why: issue 18's batch-1 goal is a ratio on one machine (>= llama.cpp on the same GGUF with 2 threads, or
>= 100 tok/s on AVX-512 and >= 3x transformers). On a shared machine the load changes by the minute, so the
engines run in alternating rounds (each round: every engine decodes ``--tokens`` tokens after the same
prompt) and the report takes each engine's median round; ratios come from the same rounds.

Per engine the number is **decode time per token**: wall time of ``tokens`` greedy tokens minus the time of
the prefill + first token, over ``tokens - 1`` (the same definition as ``octavo bench throughput``'s
``bs1_decode_tok_s``; llama.cpp is driven token by token through ``Llama.eval`` so its prefill is timed
apart exactly).

    python benchmarks/cpu_decode.py --engines octavo octavo-compiled transformers llama.cpp --threads 2

``octavo-fused`` is octavo with ``OCTAVO_CPU_FUSED_DECODE=1`` (each batch-1 decode step one C call over the
whole decoder stack, plugins/platforms/cpu_fused_decode.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from cpu_record import isa, run_info, write_record  # benchmarks/ is sys.path[0] when run as a script

_CLOCK = [time.perf_counter]


def _clock() -> float:
    """The decode timer: wall time, or process CPU time with ``--cpu-time`` (see its help)."""
    return _CLOCK[0]()


class OctavoEngine:
    def __init__(self, model: str, dtype: str, quantization: str | None, compiled: bool, threads: int,
                 fused: bool = False) -> None:
        from octavo import LLM, SamplingParams

        kw = {"quantization": quantization} if quantization else {}
        os.environ["OCTAVO_CPU_COMPILE"] = "1" if compiled else "0"  # read by the CPU platform's prepare_model
        os.environ["OCTAVO_CPU_FUSED_DECODE"] = "1" if fused else "0"  # batch-1 decode as one C call per token
        try:
            self.llm = LLM(model, dtype=dtype, num_threads=threads, enable_prefix_caching=False, max_num_seqs=8,
                           **kw)
        finally:
            os.environ.pop("OCTAVO_CPU_COMPILE")
            os.environ.pop("OCTAVO_CPU_FUSED_DECODE")
        self.SamplingParams = SamplingParams

    def decode(self, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
        sp = self.SamplingParams
        t0 = _clock()
        self.llm.generate([{"prompt_token_ids": prompt}], sp(temperature=0, max_tokens=1), use_tqdm=False)
        first = _clock() - t0
        t0 = _clock()
        out = self.llm.generate([{"prompt_token_ids": prompt}], sp(temperature=0, max_tokens=tokens, ignore_eos=True),
                                use_tqdm=False)
        return (_clock() - t0 - first) / (tokens - 1), list(out[0].outputs[0].token_ids)


class TransformersEngine:
    def __init__(self, model: str, dtype: str, threads: int) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.m = AutoModelForCausalLM.from_pretrained(os.path.dirname(model), gguf_file=os.path.basename(model),
                                                      torch_dtype=getattr(torch, dtype)).eval()

    def decode(self, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
        ids = torch.tensor([prompt])
        kw = dict(do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids))
        with torch.no_grad():
            t0 = _clock()
            self.m.generate(ids, max_new_tokens=1, **kw)
            first = _clock() - t0
            t0 = _clock()
            out = self.m.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, **kw)
            total = _clock() - t0
        return (total - first) / (tokens - 1), out[0, len(prompt):].tolist()


class LlamaCppEngine:
    def __init__(self, model: str, threads: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=1024, n_batch=512,
                         verbose=False)

    def _argmax(self) -> int:
        import llama_cpp
        import numpy as np

        # the last row's logits straight from the context (0.3.x leaves ``Llama.scores`` zero here)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.n_vocab,))
        return int(np.argmax(logits))

    def decode(self, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
        llm = self.llm
        self.n_vocab = llm.n_vocab()
        llm.reset()
        llm.eval(prompt)  # prefill, not timed
        out = [self._argmax()]
        t_first = _clock()
        for _ in range(tokens - 1):
            llm.eval([out[-1]])
            out.append(self._argmax())
        return (_clock() - t_first) / (tokens - 1), out


def build(name: str, args, model: str):
    if name == "octavo":
        return OctavoEngine(model, args.dtype, args.quantization, False, args.threads)
    if name == "octavo-compiled":
        return OctavoEngine(model, args.dtype, args.quantization, True, args.threads)
    if name == "octavo-fused":  # plugins/platforms/cpu_fused_decode.py (OCTAVO_CPU_FUSED_DECODE=1)
        return OctavoEngine(model, args.dtype, args.quantization, False, args.threads, fused=True)
    if name == "transformers":
        return TransformersEngine(model, args.hf_dtype or args.dtype, args.threads)
    if name == "llama.cpp":
        return LlamaCppEngine(model, args.threads)
    raise SystemExit(f"unknown engine {name!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", default=["octavo", "octavo-compiled", "transformers", "llama.cpp"])
    ap.add_argument("--dtype", default="bfloat16", help="octavo's dtype (and transformers' unless --hf-dtype)")
    ap.add_argument("--hf-dtype", default=None)
    ap.add_argument("--quantization", default=None, help="octavo quantization (default: the GGUF's own, 4-bit)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu-time", action="store_true",
                    help="time decode with process CPU time (time.process_time): on a loaded shared machine with "
                         "--threads 1, time the process waits for a core does not count (SMT contention still does); "
                         "every engine runs in this process, so all are timed alike")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/cpu_decode.json")
    args = ap.parse_args(argv)
    if args.cpu_time:
        _CLOCK[0] = time.process_time

    from octavo.core.loader import default_model_path

    model = default_model_path()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 49000, (args.prompt_len,), generator=g).tolist()
    engines, load_s = {}, {}
    for name in args.engines:
        t0 = time.perf_counter()
        try:
            engines[name] = build(name, args, model)
        except ImportError as e:
            print(f"{name}: not available ({e}); skipped", flush=True)
            continue
        engines[name].decode(prompt, 4)  # warm-up (and the compiled engine's first compilation)
        load_s[name] = time.perf_counter() - t0
        print(f"{name}: ready in {load_s[name]:.1f} s", flush=True)
    rounds: dict[str, list[float]] = {n: [] for n in engines}
    tokens: dict[str, list[int]] = {}
    for r in range(args.rounds):
        for name, eng in engines.items():
            torch.set_num_threads(args.threads)
            per_tok, toks = eng.decode(prompt, args.tokens)
            rounds[name].append(per_tok * 1e3)
            tokens[name] = toks
            print(f"round {r} {name:<16} {per_tok * 1e3:7.2f} ms/token  {1 / per_tok:7.1f} tok/s", flush=True)
    med = {n: statistics.median(v) for n, v in rounds.items()}
    print("\nengine            ms/token   tok/s")
    for n, ms in med.items():
        print(f"{n:<16} {ms:9.2f} {1e3 / ms:7.1f}")
    ratios = {f"{a}/{b}": med[b] / med[a] for a in med for b in med if a != b and a.startswith("octavo")
              and not b.startswith("octavo")}
    ratios.update({f"{a}/{b}": med[b] / med[a] for a in med for b in med
                   if a in ("octavo-compiled", "octavo-fused") and b == "octavo"})
    for k, v in ratios.items():
        print(f"speed ratio {k}: {v:.2f}x")
    agree = {n: sum(a == b for a, b in zip(t, tokens.get("octavo", t))) / len(t) for n, t in tokens.items()}
    record = {"machine": {"isa": isa(), "cpus": os.cpu_count(), "loadavg_start_end": None},
              **run_info(__file__, argv), "args": vars(args), "load_s": load_s, "ms_per_token_rounds": rounds,
              "ms_per_token_median": med, "tok_s_median": {n: 1e3 / v for n, v in med.items()},
              "speed_ratios": ratios, "greedy_agreement_with_octavo": agree,
              "loadavg_end": os.getloadavg()}
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
