"""Speculative decoding benchmark: output tokens/s with and without a proposer, same process, same prompts.

Workload (input-grounded, where prompt lookup pays): chat prompts that ask the model to repeat or correct a
given text, greedy, so the answer copies long spans of its prompt. Two engines are loaded side by side
(with and without ``speculative_config``) and the runs alternate, so both see the same machine load.

    python benchmarks/spec_decode.py                       # CPU, SmolLM2, ngram k=4, batch 1 and 64
    python benchmarks/spec_decode.py --batch-sizes 1 --max-tokens 64 --repeats 2 --out results.json
    # several proposers side by side (one engine each), extra engine settings, a model without a tokenizer:
    python benchmarks/spec_decode.py --speculative-config '[{"method": "ngram", "num_speculative_tokens": 4}]' \
        --llm-kwargs '{"gpu_memory_utilization": 0.2}' --token-prompts --model /path/to/config-only-dir

At batch 64 the default policy (``disable_by_batch_size`` 8) switches speculation off; that run shows
what the policy costs (it should be nothing).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from datetime import datetime, timezone

TEXTS = [
    "The city council met on Tuesday to discuss the new budget. After a long debate, the members agreed to "
    "increase funding for public libraries and parks, while reducing the budget for road repairs. The mayor "
    "said the decision reflects what residents asked for during the consultation held last spring.",
    "Photosynthesis is the process by which green plants use sunlight to make food from carbon dioxide and "
    "water. It takes place mainly in the leaves, inside small structures called chloroplasts, and it releases "
    "oxygen into the air as a by-product, which most living things need to breathe.",
    "To reset your password, open the settings page, click on the account tab, and choose the option called "
    "reset password. You will receive an email with a link. Open the link within one hour, type a new "
    "password twice, and press save. If the link has expired, start again from the settings page.",
    "The museum will be closed on Monday for maintenance. Visitors who booked tickets for that day can use "
    "them on any other day this month, or ask for a full refund at the front desk. The cafe and the gift "
    "shop will stay open as usual from nine in the morning until five in the afternoon.",
]
TASKS = ["Repeat the following text exactly, word for word:\n\n{t}",
         "Correct any mistakes in the following text and write it out in full:\n\n{t}"]


def conversations(n: int) -> list:
    out = []
    for i in range(n):
        t = TEXTS[i % len(TEXTS)]
        out.append([{"role": "user", "content": TASKS[(i // len(TEXTS)) % len(TASKS)].format(t=t)}])
    return out


def token_prompts(n: int, vocab: int = 49152) -> list:
    """Random-weight models have no tokenizer: token prompts that repeat a span (the input-grounded shape;
    acceptance on such a model means nothing)."""
    import random

    rng = random.Random(0)
    out = []
    for _ in range(n):
        span = [rng.randrange(3, vocab) for _ in range(60)]
        out.append({"prompt_token_ids": span + [rng.randrange(3, vocab) for _ in range(20)] + span[:10]})
    return out


PROMPTS = {"chat": conversations, "tokens": token_prompts}


IGNORE_EOS = [False]  # random-token prompts (a weightless model) run to max_tokens; real ones stop at EOS


def run(llm, convs, max_tokens: int) -> tuple[float, int]:
    from octavo import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=IGNORE_EOS[0])
    t0 = time.perf_counter()
    outs = (llm.generate if isinstance(convs[0], dict) else llm.chat)(convs, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return dt, sum(len(o.outputs[0].token_ids) for o in outs)


def acceptance(llm) -> dict:
    s = llm.llm_engine.get_stats()
    return {"drafts": s.spec_decode_num_drafts, "draft_tokens": s.spec_decode_num_draft_tokens,
            "accepted": s.spec_decode_num_accepted_tokens, "emitted": s.spec_decode_num_emitted_tokens,
            "acceptance_rate": round(s.spec_decode_acceptance_rate, 3),
            "accepted_per_pos": list(s.spec_decode_accepted_per_pos), **_graph_counts(llm)}


def _graph_counts(llm) -> dict:
    """CUDA-graph replays of decode and verify steps (in-process engines on a GPU; empty elsewhere)."""
    try:
        runner = llm.llm_engine.core.executor.driver.runner.graph_runner
    except AttributeError:
        return {}
    if runner is None:
        return {}
    return {"graph_replays_decode": getattr(runner, "num_replays", None),
            "graph_replays_verify": getattr(runner, "num_verify_replays", None),
            "verify_graphs": len(getattr(runner, "verify_graphs", {}))}


def main(argv=None) -> int:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="target model (default: embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--speculative-config", default='{"method": "ngram", "num_speculative_tokens": 4, '
                    '"prompt_lookup_max": 3}')
    ap.add_argument("--batch-sizes", default="1,64")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs per engine and batch size")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-threads", type=int, default=None, help="torch threads per engine")
    ap.add_argument("--batch1-prompts", type=int, default=8, help="conversations run one at a time at batch 1")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--llm-kwargs", default="{}", help="JSON: more LLM(...) settings for every engine")
    ap.add_argument("--token-prompts", action="store_true", help="random token prompts (model without tokenizer)")
    ap.add_argument("--prompt-file", default=None, help="JSON {'prompt_token_ids': [[...], ...]}: the chat workload "
                    "pre-tokenized (benchmarks/data/spec_decode_smollm2_prompts.json), for engines without a tokenizer")
    args = ap.parse_args(argv)

    from octavo import LLM

    spec_cfgs = json.loads(args.speculative_config)
    spec_cfgs = spec_cfgs if isinstance(spec_cfgs, list) else [spec_cfgs]
    spec_cfg = spec_cfgs[0] if len(spec_cfgs) == 1 else spec_cfgs
    common = dict(model=args.model, dtype=args.dtype, max_model_len=1024, seed=0, num_threads=args.num_threads,
                  **json.loads(args.llm_kwargs))
    prompts = PROMPTS["tokens" if args.token_prompts else "chat"]
    IGNORE_EOS[0] = args.token_prompts
    if args.prompt_file:
        with open(args.prompt_file) as f:
            ids = json.load(f)["prompt_token_ids"]
        prompts = lambda n: [{"prompt_token_ids": ids[i % len(ids)]} for i in range(n)]  # noqa: E731
    t0 = time.perf_counter()
    engines = {"base": LLM(**common)}
    for i, cfg in enumerate(spec_cfgs):
        engines["spec" if len(spec_cfgs) == 1 else f"spec{i}_{cfg.get('method', 'draft_model')}"] = \
            LLM(speculative_config=cfg, **common)
    print(f"{len(engines)} engines loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    for llm in engines.values():
        run(llm, prompts(1), 8)  # warm-up

    results = []
    for bs in [int(x) for x in args.batch_sizes.split(",")]:
        row = {"batch_size": bs, "tokens": {}, **{f"{name}_tok_s": [] for name in engines}}
        for _ in range(args.repeats):
            for name, llm in engines.items():
                if bs == 1:  # batch 1: one conversation at a time
                    dt, n = 0.0, 0
                    for conv in prompts(args.batch1_prompts):
                        d, k = run(llm, [conv], args.max_tokens)
                        dt, n = dt + d, n + k
                else:
                    dt, n = run(llm, prompts(bs), args.max_tokens)
                row[f"{name}_tok_s"].append(round(n / dt, 2))
                row["tokens"][name] = n
        for name, llm in engines.items():
            if name != "base":
                key = "speedup" if name == "spec" else f"speedup_{name}"
                row[key] = round(sum(row[f"{name}_tok_s"]) / sum(row["base_tok_s"]), 3)
                row["spec_stats_cumulative" if name == "spec" else f"stats_{name}"] = acceptance(llm)
        results.append(row)
        print(json.dumps(row), flush=True)

    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="minutes"), "machine": platform.machine(),
            "cpu": _cpu_model(), "speculative_config": spec_cfg, "max_tokens": args.max_tokens,
            "dtype": args.dtype, "model": args.model or "SmolLM2-135M-Instruct (embedded GGUF)",
            "num_threads": args.num_threads, "command": "python benchmarks/spec_decode.py " + " ".join(argv or []),
            "llm_kwargs": json.loads(args.llm_kwargs), "device": _device(),
            "note": "compare base and spec of the same run only (engines alternate; shared machines are noisy)"}
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    for llm in engines.values():
        llm.llm_engine.shutdown()
    return 0


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "")
    except OSError:
        return ""


if __name__ == "__main__":
    raise SystemExit(main())
