"""``octavo bench serve`` with ``vllm bench serve``'s flags and meanings (issue 16).

    octavo bench serve --model smol --dataset-name random --random-input-len 128 --random-output-len 64 \\
        --num-prompts 50 --request-rate 4 --max-concurrency 8 --save-result

Any of ``--max-concurrency``, ``--request-rate``, ``--dataset-name`` switches to vLLM's run: one run of
``--num-prompts`` requests (default 1000, as vLLM), sent at a Poisson ``--request-rate`` (``inf``: all at
once), at most ``--max-concurrency`` in flight (default: no limit). Datasets: ``random`` (token ids; lengths
drawn in ``[len * (1 - r), len * (1 + r)]`` with ``--random-range-ratio r``) and ``sharegpt``
(``--dataset-path`` JSON: first human turn = prompt, the reply's token count = output length, vLLM's
filters: prompt >= 4 and <= 1024 tokens, output >= 4, sum <= 2048; counted with the server's /tokenize).
``--ignore-eos`` is off by default, as in vLLM. ``--save-result`` alone writes
``<result-dir>/<result-filename>`` (default ``openai-<rate>qps-concurrency<c>-<model>-<date>.json``); with a
path it writes there (octavo's older form). The JSON has vLLM's flat keys (``mean_ttft_ms``,
``median_tpot_ms``, ``p99_itl_ms``, ``request_throughput``, ...) next to octavo's ``levels``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import time
from datetime import datetime
from typing import Any

VLLM_FLAGS = ("max_concurrency", "request_rate", "dataset_name")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-concurrency", type=int, default=None, help="vLLM: most requests in flight (default: "
                   "no limit).")
    p.add_argument("--request-rate", type=float, default=None, help="vLLM: requests per second, Poisson arrivals "
                   "(default inf: all at once).")
    p.add_argument("--dataset-name", choices=["random", "sharegpt"], default=None, help="vLLM: prompt source.")
    p.add_argument("--dataset-path", default=None, help="vLLM: the ShareGPT JSON file (--dataset-name sharegpt).")
    p.add_argument("--random-input-len", dest="input_len", type=int, help="vLLM's name of --input-len.")
    p.add_argument("--random-output-len", dest="output_len", type=int, help="vLLM's name of --output-len.")
    p.add_argument("--random-range-ratio", type=float, default=0.0, help="vLLM: lengths vary by this fraction.")
    p.add_argument("--ignore-eos", action="store_true", help="vLLM: keep generating past EOS (vLLM mode; octavo's "
                   "concurrency sweep always ignores EOS).")
    p.add_argument("--host", default=None, help="vLLM: server host (with --port; else --base-url).")
    p.add_argument("--port", type=int, default=None, help="vLLM: server port.")
    p.add_argument("--endpoint", default="/v1/completions", help="vLLM: only /v1/completions is measured.")
    p.add_argument("--model", default=None, help="vLLM: model name to send (default: the server's first).")
    p.add_argument("--result-dir", default=".", help="vLLM: where a bare --save-result writes.")
    p.add_argument("--result-filename", default=None, help="vLLM: the file name a bare --save-result writes.")


def is_vllm_mode(args: argparse.Namespace) -> bool:
    return any(getattr(args, name) is not None for name in VLLM_FLAGS)


def check_args(args: argparse.Namespace) -> str | None:
    """vLLM's flags that octavo cannot honor as given: the message, else None."""
    if args.endpoint != "/v1/completions":
        return f"--endpoint {args.endpoint}: only /v1/completions is benchmarked"
    if args.dataset_name == "sharegpt" and not args.dataset_path:
        return "--dataset-name sharegpt needs --dataset-path (the ShareGPT JSON file)"
    if args.dataset_name != "sharegpt" and args.dataset_path:
        return "--dataset-path is read only with --dataset-name sharegpt"
    if not 0 <= args.random_range_ratio < 1:
        return "--random-range-ratio must be in [0, 1)"
    if args.max_concurrency is not None and args.max_concurrency < 1:
        return "--max-concurrency must be >= 1"
    if args.request_rate is not None and not args.request_rate > 0:
        return "--request-rate must be > 0 (or inf)"
    return None


def random_requests(num: int, input_len: int, output_len: int, ratio: float, vocab_size: int,
                    seed: int) -> list[tuple[list[int], int, int]]:
    """(prompt ids, prompt length, output length) with vLLM's random-dataset length spread."""
    rng = random.Random(seed)
    lo, hi = min(1000, vocab_size // 4), vocab_size - 1
    out = []
    for _ in range(num):
        n_in = rng.randint(max(1, int(input_len * (1 - ratio))), max(1, int(input_len * (1 + ratio))))
        n_out = rng.randint(max(1, int(output_len * (1 - ratio))), max(1, int(output_len * (1 + ratio))))
        out.append(([rng.randint(lo, hi) for _ in range(n_in)], n_in, n_out))
    return out


def sharegpt_requests(path: str, num: int, base_url: str, headers: dict, seed: int) -> list[tuple[str, int, int]]:
    """vLLM's ShareGPT sampling: conversations with >= 2 turns, shuffled, lengths by the server's tokenizer."""
    import httpx

    with open(path) as f:
        data = [d for d in json.load(f) if len(d.get("conversations", [])) >= 2]
    random.Random(seed).shuffle(data)
    out: list[tuple[str, int, int]] = []
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
        def count(text: str) -> int:
            r = client.post("/tokenize", json={"prompt": text})
            r.raise_for_status()
            return r.json()["count"]

        for d in data:
            if len(out) == num:
                break
            prompt, reply = d["conversations"][0]["value"], d["conversations"][1]["value"]
            n_in, n_out = count(prompt), count(reply)
            if n_in < 4 or n_out < 4 or n_in > 1024 or n_in + n_out > 2048:
                continue
            out.append((prompt, n_in, n_out))
    if len(out) < num:
        raise ValueError(f"{path}: only {len(out)} ShareGPT conversations pass vLLM's length filters; asked for "
                         f"{num} (--num-prompts).")
    return out


async def run_vllm(base_url: str, model: str, requests: list, max_concurrency: int | None, request_rate: float,
                   ignore_eos: bool, api_key: str | None, seed: int) -> dict[str, Any]:
    """vLLM's loop: each request starts at its Poisson arrival time, then waits for a concurrency slot."""
    import httpx

    from octavo.cli.bench_serve import _one

    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    rng = random.Random(seed)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    limit = (max_concurrency or len(requests)) + 4
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0),
                                 limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit)) as client:
        async def one(prompt: Any, n_in: int, n_out: int) -> Any:
            if sem is None:
                res = await _one(client, url, model, prompt, n_out, headers, ignore_eos=ignore_eos)
            else:
                async with sem:
                    res = await _one(client, url, model, prompt, n_out, headers, ignore_eos=ignore_eos)
            res.prompt_len = n_in
            return res

        tasks = []
        t0 = time.perf_counter()
        for prompt, n_in, n_out in requests:
            tasks.append(asyncio.ensure_future(one(prompt, n_in, n_out)))
            if math.isfinite(request_rate):
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    return _metrics(results, duration)


def _metrics(results: list, duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ms = {"ttft": [r.ttft * 1000 for r in ok], "e2el": [r.e2el * 1000 for r in ok],
          "itl": [x * 1000 for r in ok for x in r.itl],
          "tpot": [(r.e2el - r.ttft) * 1000 / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]}
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    m: dict[str, Any] = {"duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
                         "errors": sorted({r.error for r in results if not r.ok})[:5],
                         "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
                         "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
                         "total_token_throughput": (in_tokens + out_tokens) / duration}
    for name, values in ms.items():
        from octavo.cli.bench_serve import _percentile

        m[f"mean_{name}_ms"] = statistics.fmean(values) if values else float("nan")
        m[f"median_{name}_ms"] = statistics.median(values) if values else float("nan")
        m[f"std_{name}_ms"] = statistics.pstdev(values) if values else float("nan")
        for p in (50, 90, 99):
            m[f"p{p}_{name}_ms"] = _percentile(values, p)
    return m


def run(args: argparse.Namespace) -> int:
    """The vLLM-mode run; prints vLLM's summary block and saves the result as asked."""
    import sys

    from octavo.cli.bench_serve import server_model

    problem = check_args(args)
    if problem:
        print(f"octavo bench serve: error: {problem}", file=sys.stderr)
        return 2
    base_url = f"http://{args.host or '127.0.0.1'}:{args.port or 8000}" if (args.host or args.port) else args.base_url
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    num = args.num_prompts or 1000
    rate = args.request_rate if args.request_rate is not None else float("inf")
    try:
        model = args.model or server_model(base_url, args.api_key)[0]
        if args.dataset_name == "sharegpt":
            reqs = sharegpt_requests(args.dataset_path, num, base_url, headers, args.seed)
        else:
            reqs = random_requests(num, args.input_len or 1024, args.output_len or 128, args.random_range_ratio,
                                   args.vocab_size, args.seed)
        m = asyncio.run(run_vllm(base_url, model, reqs, args.max_concurrency, rate, args.ignore_eos, args.api_key,
                                 args.seed))
    except Exception as e:  # noqa: BLE001 - one line, not a traceback
        print(f"octavo bench serve: error: cannot benchmark {base_url}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    result = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "openai", "model_id": model,
              "base_url": base_url, "dataset_name": args.dataset_name or "random", "num_prompts": num,
              "request_rate": rate if math.isfinite(rate) else "inf", "burstiness": 1.0,
              "max_concurrency": args.max_concurrency, "ignore_eos": args.ignore_eos, **m}
    print(summary(result), flush=True)
    if args.save_result:
        path = args.save_result if isinstance(args.save_result, str) else os.path.join(
            args.result_dir, args.result_filename or
            f"openai-{result['request_rate']}qps-concurrency{args.max_concurrency}-{model.split('/')[-1]}-"
            f"{result['date']}.json")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
        print(f"saved {path}")
    return 0 if m["failed"] == 0 else 1


def summary(r: dict[str, Any]) -> str:
    lines = ["============ Serving Benchmark Result ============",
             f"Successful requests:                     {r['completed']}",
             f"Maximum request concurrency:             {r['max_concurrency']}",
             f"Request rate (req/s):                    {r['request_rate']}",
             f"Benchmark duration (s):                  {r['duration']:.2f}",
             f"Total input tokens:                      {r['total_input_tokens']}",
             f"Total generated tokens:                  {r['total_output_tokens']}",
             f"Request throughput (req/s):              {r['request_throughput']:.2f}",
             f"Output token throughput (tok/s):         {r['output_throughput']:.2f}",
             f"Total Token throughput (tok/s):          {r['total_token_throughput']:.2f}"]
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency")):
        lines += [f"{'-' * 15}{title}{'-' * 15}", f"Mean {name.upper()} (ms):     {r[f'mean_{name}_ms']:.2f}",
                  f"Median {name.upper()} (ms):   {r[f'median_{name}_ms']:.2f}",
                  f"P99 {name.upper()} (ms):      {r[f'p99_{name}_ms']:.2f}"]
    if r["failed"]:
        lines.append(f"Failed requests: {r['failed']} {r['errors']}")
    return "\n".join(lines + ["=" * 50])
