"""``octavo bench``: benchmarks, one sub-subcommand each.

    octavo bench serve --base-url http://127.0.0.1:8000 --concurrency 1 8 32 --input-len 128 --output-len 128

``serve`` measures a running OpenAI-compatible server (TTFT, TPOT, ITL, end-to-end latency percentiles,
output throughput) with ``vllm bench serve``'s definitions; see ``octavo.cli.bench_serve``. Other
benchmarks (``throughput``, offline) add their own sub-subcommand in ``add_parser`` below.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="Benchmarks (serve: a running server's latency and throughput).",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
    _add_serve(sub)
    _add_throughput(sub)


def _add_throughput(sub) -> None:
    from octavo.cli import bench_throughput

    p = sub.add_parser("throughput", help="Offline throughput, octavo vs transformers generate, in one run.",
                       description=bench_throughput.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_throughput.add_arguments(p)
    p.set_defaults(func=lambda args: bench_throughput.run(args))


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="Latency and throughput of a running OpenAI-compatible server.",
                       description=__import__("octavo.cli.bench_serve", fromlist=["x"]).__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="Server address (default: %(default)s).")
    p.add_argument("--api-key", default=None, help="Bearer key, if the server wants one.")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32],
                   help="Concurrency levels (most requests in flight), default: %(default)s.")
    p.add_argument("--input-len", type=int, default=None, help="Prompt length in tokens (default: 128; vLLM mode: "
                   "1024, as --random-input-len).")
    p.add_argument("--output-len", type=int, default=None, help="Output tokens per request (default: 128).")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="Requests per level (default: --waves x concurrency).")
    p.add_argument("--waves", type=int, default=2, help="Requests per level as a multiple of its concurrency.")
    p.add_argument("--vocab-size", type=int, default=49152,
                   help="Random prompt token ids are drawn below this (default: %(default)s, SmolLM2's).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="server", help="Name of this run in the output and the plot.")
    p.add_argument("--save-result", metavar="JSON", nargs="?", const=True, default=None,
                   help="Write the metrics here; alone (vLLM's form): to --result-dir/--result-filename.")
    p.add_argument("--plot", metavar="PNG", default=None, help="Draw latency and throughput against concurrency "
                   "(default: beside --save-result, same name with .png).")
    p.add_argument("--compare", metavar="JSON", nargs="+", default=[],
                   help="Earlier --save-result files (e.g. the peer's) to draw in the same plot.")
    from octavo.cli import bench_serve_vllm

    bench_serve_vllm.add_arguments(p)  # vllm bench serve's flags: --max-concurrency, --request-rate, --dataset-name
    p.set_defaults(func=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    from octavo.cli import bench_serve, bench_serve_vllm
    from octavo.cli.bench_plot import load_runs, png_beside

    if bench_serve_vllm.is_vllm_mode(args):  # one run with vLLM's meaning of each flag
        return bench_serve_vllm.run(args)
    if args.save_result is True:  # bare --save-result (vLLM's form)
        args.save_result = os.path.join(args.result_dir, args.result_filename or
                                        f"octavo-bench-serve-{time.strftime('%Y%m%d-%H%M%S')}.json")
    try:
        peers = load_runs(args.compare)
    except (OSError, ValueError) as e:
        print(f"octavo bench serve: error: --compare: {e}", file=sys.stderr)
        return 2
    try:
        result = bench_serve.run_benchmark(args.base_url, concurrencies=args.concurrency,
                                           input_len=args.input_len or 128, output_len=args.output_len or 128,
                                           num_prompts=args.num_prompts,
                                           vocab_size=args.vocab_size, api_key=args.api_key, seed=args.seed,
                                           label=args.label, waves=args.waves)
    except Exception as e:  # noqa: BLE001 - e.g. nothing listening: one line, not a traceback
        print(f"octavo bench serve: error: cannot benchmark {args.base_url}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 1
    if args.save_result:
        with open(args.save_result, "w") as f:
            json.dump(result, f, indent=2)
    plot_path = args.plot or (png_beside(args.save_result) if args.save_result else None)
    if plot_path:
        bench_serve.plot([result, *peers], plot_path)
    return 0 if all(lv["failed"] == 0 for lv in result["levels"]) else 1
