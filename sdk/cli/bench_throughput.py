"""Offline throughput: octavo vs Hugging Face transformers ``generate`` on the same workload, in one run.

Workload (issue 3): SmolLM2-135M-Instruct, 64 prompts of 128 random tokens, 128 new tokens each
(ignore_eos), in each dtype asked for; plus batch-1 decode tokens/s. Output tokens/s are total generated
tokens over wall time, as in ``vllm bench throughput``. Prints a table, writes JSON to
benchmarks/results/ and a PNG bar chart.

    octavo bench throughput --dtypes bfloat16 float32
    python benchmarks/throughput.py --dtypes bfloat16      # the same, from a checkout
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as pyplatform
import subprocess
import sys
import time


def make_prompts(num: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import torch  # here, not at the top: `octavo serve` builds this command's parser (docs/loading.md)

    g = torch.Generator().manual_seed(seed)
    # stay clear of the special tokens at the start of SmolLM2's vocabulary
    return torch.randint(100, vocab, (num, length), generator=g).tolist()


def run_octavo(model: str, dtype: str, prompts, new_tokens: int, max_num_seqs: int) -> dict:
    from octavo import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model, dtype=dtype, max_num_seqs=max_num_seqs, enable_prefix_caching=False,
              max_num_batched_tokens=max(2048, len(prompts[0]) * 16))
    load_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=True)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    # the same prompts with one new token: the prefill's share of the run (phases, issue 18)
    t0, c0 = time.perf_counter(), time.process_time()
    llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=1),
                 use_tqdm=False)
    prefill_s, prefill_cpu = time.perf_counter() - t0, time.process_time() - c0
    # batch-1 decode: one request, time per output token after the first
    t0 = time.perf_counter()
    one = llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    ttft = time.perf_counter() - t0
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)
    b1 = time.perf_counter() - t0
    del one
    return {"output_tok_s": n_out / elapsed, "elapsed_s": elapsed, "num_output_tokens": n_out,
            "load_s": load_s, "bs1_decode_tok_s": (new_tokens - 1) / max(b1 - ttft, 1e-9),
            "phases": _phases(elapsed, prefill_s, new_tokens, cpu, prefill_cpu)}


def _phases(elapsed: float, prefill_s: float, new_tokens: int, cpu_s: float, prefill_cpu_s: float) -> dict:
    """Where the run went: the prompts' prefill (timed alone, one new token) and the rest = decode steps; also
    the process's CPU seconds of each (all its threads: on a shared machine the wall clock includes waiting
    for a core, the CPU time does not)."""
    decode_s = max(elapsed - prefill_s, 0.0)
    decode_cpu = max(cpu_s - prefill_cpu_s, 0.0)
    return {"prefill_s": round(prefill_s, 3), "decode_s": round(decode_s, 3),
            "decode_ms_per_step": round(decode_s / max(new_tokens - 1, 1) * 1e3, 2),
            "cpu_s": round(cpu_s, 3), "prefill_cpu_s": round(prefill_cpu_s, 3),
            "decode_cpu_ms_per_step": round(decode_cpu / max(new_tokens - 1, 1) * 1e3, 2)}


def run_transformers(model: str, dtype: str, prompts, new_tokens: int, batch_size: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    kw = {}
    if model.endswith(".gguf"):
        kw = {"gguf_file": os.path.basename(model)}
        model = os.path.dirname(model)
    m = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch_dtype, **kw).eval()
    n_out = 0
    gen_kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        m.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False, pad_token_id=0)  # warm-up
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(0, len(prompts), batch_size):
            # equal-length prompts: no padding needed, so the comparison is not skewed by it
            batch = torch.tensor(prompts[i:i + batch_size])
            out = m.generate(batch, attention_mask=torch.ones_like(batch), **gen_kw)
            n_out += (out.shape[1] - batch.shape[1]) * batch.shape[0]
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(0, len(prompts), batch_size):  # the prefill alone (one new token), as for octavo
            batch = torch.tensor(prompts[i:i + batch_size])
            m.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=1, do_sample=False,
                       pad_token_id=0)
        prefill_s, prefill_cpu = time.perf_counter() - t0, time.process_time() - c0
        t0 = time.perf_counter()
        m.generate(torch.tensor([prompts[0]]), max_new_tokens=1, do_sample=False, pad_token_id=0)
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        m.generate(torch.tensor([prompts[0]]), **gen_kw)
        b1 = time.perf_counter() - t0
    return {"output_tok_s": n_out / elapsed, "elapsed_s": elapsed, "num_output_tokens": n_out,
            "batch_size": batch_size, "bs1_decode_tok_s": (new_tokens - 1) / max(b1 - ttft, 1e-9),
            "phases": _phases(elapsed, prefill_s, new_tokens, cpu, prefill_cpu)}


def plot(results: dict, path: str) -> bool:
    """octavo's bars (and the peer's, transformers, when it ran) per dtype; False when matplotlib is missing."""
    from octavo.cli.bench_plot import pyplot

    plt = pyplot(path)
    if plt is None:
        return False
    dtypes = list(results)
    engines = [e for e in ("octavo", "transformers") if all(e in results[d] for d in dtypes)]
    width = 0.8 / len(engines)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, title in ((axes[0], "output_tok_s", "Offline throughput (output tok/s)"),
                           (axes[1], "bs1_decode_tok_s", "Batch-1 decode (tok/s)")):
        xs = range(len(dtypes))
        for i, eng in enumerate(engines):
            offset = (i - (len(engines) - 1) / 2) * width
            ax.bar([x + offset for x in xs], [results[d][eng][key] for d in dtypes], width, label=eng)
        ax.set_xticks(list(xs), dtypes)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help="Model path (default: the embedded SmolLM2 GGUF).")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--hf-batch-size", type=int, default=64)
    ap.add_argument("--hf-output-len", type=int, default=None,
                    help="New tokens per prompt for the transformers peer (default: --output-len). Fewer tokens "
                         "bound the peer's run time on a slow machine; its tok/s is still tokens over time, at "
                         "shorter contexts, so a shorter peer run can only flatter the peer.")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--out", default="benchmarks/results", help="Folder for the JSON and PNG results.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv), argv)


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    import torch

    from octavo.core.loader import default_model_path

    model = args.model or default_model_path()
    prompts = make_prompts(args.num_prompts, args.input_len, 49152)
    results = {}
    for dtype in args.dtypes:
        print(f"== {dtype}: octavo", flush=True)
        res = {"octavo": run_octavo(model, dtype, prompts, args.output_len, args.max_num_seqs)}
        if not args.skip_transformers:
            print(f"== {dtype}: transformers", flush=True)
            hf_len = args.hf_output_len or args.output_len
            res["transformers"] = run_transformers(model, dtype, prompts, hf_len, args.hf_batch_size)
            res["transformers"]["output_len"] = hf_len
            res["ratio_vs_transformers"] = res["octavo"]["output_tok_s"] / res["transformers"]["output_tok_s"]
        results[dtype] = res
    print(f"\n{'dtype':<10}{'engine':<14}{'out tok/s':>12}{'bs1 tok/s':>12}")
    for dtype, res in results.items():
        for eng in ("octavo", "transformers"):
            if eng in res:
                ph = res[eng]["phases"]
                print(f"{dtype:<10}{eng:<14}{res[eng]['output_tok_s']:>12.1f}{res[eng]['bs1_decode_tok_s']:>12.1f}"
                      f"   prefill {ph['prefill_s']:.2f} s, decode {ph['decode_s']:.2f} s "
                      f"({ph['decode_ms_per_step']:.1f} ms/step); CPU prefill {ph['prefill_cpu_s']:.2f} s, "
                      f"decode {ph['decode_cpu_ms_per_step']:.1f} ms/step")
        if "ratio_vs_transformers" in res:
            print(f"{dtype:<10}{'ratio':<14}{res['ratio_vs_transformers']:>12.2f}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"card": f"CPU: {pyplatform.processor() or pyplatform.machine()}, {torch.get_num_threads()} threads",
              "date": datetime.date.today().isoformat(), "command": "octavo bench throughput " + " ".join(
                  argv if argv is not None else sys.argv[3 if sys.argv[1:3] == ["bench", "throughput"] else 1:]), "commit": commit, "results": results}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu_throughput.json"), "w") as f:
        json.dump(record, f, indent=2)
    plot(results, os.path.join(args.out, "cpu_throughput.png"))  # beside the JSON
    return 0


if __name__ == "__main__":
    sys.exit(main())
