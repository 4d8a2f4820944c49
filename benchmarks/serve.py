"""Serving benchmark: octavo (core in its own process, and in-process) against llama.cpp's ``llama-server``.

For each server: start it, time ``start -> first answered request``, then run the ``octavo bench serve``
client (``vllm bench serve`` definitions: TTFT, TPOT, ITL, E2EL percentiles, output throughput) at each
concurrency, back to back with the same random token-id prompts, then stop it. Writes a JSON of everything
to ``benchmarks/results/`` and a PNG plot beside it, and prints a Markdown table for docs/performance.md.

    python benchmarks/serve.py                                   # octavo only
    python benchmarks/serve.py --llama-server /path/to/llama-server
    python benchmarks/serve.py --servers --octavo-variants "" "--num-threads 2" --concurrency 1 32 --rounds 3

``--octavo-variants``: an A/B on a shared (noisy) machine. One ``octavo serve`` per variant runs at the same time
(idle ones sleep), and each round runs the levels on every variant in turn (the order alternates), so drifting
load hits all variants alike; per-round numbers and their medians are recorded.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time

import httpx

from octavo.cli import bench_serve
from octavo.server.launch import ServerProcess, free_port


def first_answer(url: str, t0: float, model: str | None = None, timeout_s: float = 300) -> float:
    """Seconds from ``t0`` until a 1-token completion is answered (polling while the server starts)."""
    deadline = time.monotonic() + timeout_s
    body = {"prompt": "Hello", "max_tokens": 1, **({"model": model} if model else {})}
    while time.monotonic() < deadline:
        try:
            if httpx.post(url + "/v1/completions", json=body, timeout=30).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url} answered no request within {timeout_s} s")


def cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) so far of ``pid`` and of each of its descendants, by pid."""
    import psutil

    out: dict[int, float] = {}
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            t = proc.cpu_times()
            out[proc.pid] = t.user + t.system
    except psutil.Error:
        pass
    return out


def _cpu_split(root: int, before: dict[int, float], after: dict[int, float], wall_s: float, client_s: float) -> dict:
    """Each process's CPU seconds over the benchmark and its share of one CPU (where a 2-CPU box's time went):
    the server's front end (``root``), its busiest descendant (octavo's engine core), other descendants, and
    this benchmark client."""
    used = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    named = {"front end": used.pop(root, 0.0)}
    for i, (pid, sec) in enumerate(sorted(used.items(), key=lambda kv: -kv[1])):
        named["core" if i == 0 else f"child {pid}"] = sec
    named["benchmark client"] = client_s
    return {"wall_s": round(wall_s, 2), "cpu_s": {k: round(v, 2) for k, v in named.items()},
            "cpus_busy": {k: round(v / wall_s, 3) for k, v in named.items()}}


def run_octavo(label: str, extra: list[str], args: argparse.Namespace) -> dict:
    log = os.path.join(args.out_dir, f"serve-{label.replace(' ', '_')}.log")
    srv = ServerProcess(["--max-model-len", str(args.max_model_len), "--uvicorn-log-level", "warning",
                         *args.octavo_args.split(), *extra], log_path=log)
    t0 = time.perf_counter()
    srv.start()
    startup = first_answer(srv.url, t0)
    try:
        before, c0, w0 = cpu_seconds(srv.proc.pid), time.process_time(), time.perf_counter()
        result = bench_serve.run_benchmark(srv.url, concurrencies=args.concurrency, input_len=args.input_len,
                                           output_len=args.output_len, num_prompts=args.num_prompts,
                                           vocab_size=args.vocab_size, label=label, seed=args.seed,
                                           waves=args.waves)
        split = _cpu_split(srv.proc.pid, before, cpu_seconds(srv.proc.pid), time.perf_counter() - w0, time.process_time() - c0)
    finally:
        srv.stop()
    print(f"{label}: CPUs busy over the benchmark {split['cpus_busy']}", flush=True)
    result.update(startup_to_health_s=srv.startup_s, startup_to_first_answer_s=startup,
                  command="octavo serve " + " ".join(srv.args), cpu_split=split)
    return result


def parse_variant(text: str) -> tuple[dict[str, str], list[str]]:
    """``"OMP_WAIT_POLICY=passive --num-threads 2"`` -> ({env}, [flags]): leading NAME=VALUE words are environment."""
    env, flags = {}, []
    for word in shlex.split(text):
        m = re.fullmatch(r"([A-Z_][A-Z0-9_]*)=(.*)", word)
        if m and not flags:
            env[m.group(1)] = m.group(2)
        else:
            flags.append(word)
    return env, flags


def run_octavo_variants(args: argparse.Namespace) -> list[dict]:
    """Every variant's server up at once; ``--rounds`` rounds, each running the levels on every variant in turn."""
    servers = []
    try:
        for i, text in enumerate(args.octavo_variants):
            env, flags = parse_variant(text)
            log = os.path.join(args.out_dir, f"serve-variant{i}.log")
            srv = ServerProcess(["--max-model-len", str(args.max_model_len), "--uvicorn-log-level", "warning",
                                 *args.octavo_args.split(), *flags], env=env, log_path=log)
            t0 = time.perf_counter()
            srv.start()
            first_answer(srv.url, t0)
            servers.append({"label": text or "default", "env": env, "srv": srv, "rounds": []})
        for r in range(args.rounds):
            for v in (servers if r % 2 == 0 else servers[::-1]):
                srv = v["srv"]
                before, c0, w0 = cpu_seconds(srv.proc.pid), time.process_time(), time.perf_counter()
                res = bench_serve.run_benchmark(srv.url, concurrencies=args.concurrency, input_len=args.input_len,
                                                output_len=args.output_len, num_prompts=args.num_prompts,
                                                vocab_size=args.vocab_size, label=v["label"], seed=args.seed + 100 * r,
                                                waves=args.waves)
                res["cpu_split"] = _cpu_split(srv.proc.pid, before, cpu_seconds(srv.proc.pid),
                                              time.perf_counter() - w0, time.process_time() - c0)
                res["round"], res["load_avg"] = r, os.getloadavg()[0]
                v["rounds"].append(res)
    finally:
        for v in servers:
            v["srv"].stop()
    runs = []
    for v in servers:
        levels = []
        for j, c in enumerate(args.concurrency):
            per = [rd["levels"][j] for rd in v["rounds"]]
            levels.append({"concurrency": c, "output_throughput_rounds": [lv["output_throughput"] for lv in per],
                           "tpot_p50_ms_rounds": [lv["tpot_ms"]["p50"] for lv in per],
                           "output_throughput": statistics.median(lv["output_throughput"] for lv in per),
                           "tpot_p50_ms": statistics.median(lv["tpot_ms"]["p50"] for lv in per)})
        runs.append({"label": v["label"], "env": v["env"], "command": "octavo serve " + " ".join(v["srv"].args),
                     "levels": levels, "rounds": v["rounds"]})
    return runs


def variants_markdown(runs: list[dict]) -> str:
    lines = ["| variant | conc. | out tok/s median (rounds) | TPOT p50 ms median (rounds) |", "|---" * 4 + "|"]
    for run in runs:
        for lv in run["levels"]:
            lines.append(f"| {run['label']} | {lv['concurrency']} | {lv['output_throughput']:.1f} "
                         f"({', '.join(f'{x:.1f}' for x in lv['output_throughput_rounds'])}) | {lv['tpot_p50_ms']:.1f} "
                         f"({', '.join(f'{x:.1f}' for x in lv['tpot_p50_ms_rounds'])}) |")
    return "\n".join(lines)


def run_llama_server(args: argparse.Namespace) -> dict:
    from octavo.core.loader import default_model_path

    port = free_port()
    ctx = args.num_slots * (args.input_len + args.output_len + 16)
    cmd = [args.llama_server, "-m", default_model_path(), "-t", str(args.threads), "-np", str(args.num_slots),
           "-c", str(ctx), "--port", str(port), "--host", "127.0.0.1"]
    log = open(os.path.join(args.out_dir, "serve-llama-server.log"), "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        startup = first_answer(url, t0)
        before, c0, w0 = cpu_seconds(proc.pid), time.process_time(), time.perf_counter()
        result = bench_serve.run_benchmark(url, concurrencies=args.concurrency, input_len=args.input_len,
                                           output_len=args.output_len, num_prompts=args.num_prompts,
                                           vocab_size=args.vocab_size, label="llama-server", seed=args.seed,
                                           waves=args.waves)
        split = _cpu_split(proc.pid, before, cpu_seconds(proc.pid), time.perf_counter() - w0, time.process_time() - c0)
        print(f"llama-server: CPUs busy over the benchmark {split['cpus_busy']}", flush=True)
        result["cpu_split"] = split
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    result.update(startup_to_first_answer_s=startup, command=" ".join(cmd))
    return result


def machine() -> dict:
    import psutil

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "logical_cores": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30),
            "load_avg_at_start": os.getloadavg(), "python": platform.python_version()}


def markdown(runs: list[dict]) -> str:
    lines = ["| server | conc. | out tok/s | req/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | ITL p50 / p99 (ms) "
             "| E2EL p50 (ms) | start -> first answer (s) |", "|---" * 9 + "|"]
    for run in runs:
        for lv in run["levels"]:
            lines.append(
                f"| {run['label']} | {lv['concurrency']} | {lv['output_throughput']:.1f} | "
                f"{lv['request_throughput']:.2f} | {lv['ttft_ms']['p50']:.0f} / {lv['ttft_ms']['p99']:.0f} | "
                f"{lv['tpot_ms']['p50']:.1f} / {lv['tpot_ms']['p99']:.1f} | "
                f"{lv['itl_ms']['p50']:.1f} / {lv['itl_ms']['p99']:.1f} | {lv['e2el_ms']['p50']:.0f} | "
                f"{run.get('startup_to_first_answer_s', float('nan')):.1f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-prompts", type=int, default=None, help="per level (default: --waves x concurrency)")
    p.add_argument("--waves", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=49152)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--servers", nargs="*", default=["octavo-mp", "octavo-inproc", "llama-server"],
                   choices=["octavo-mp", "octavo-inproc", "llama-server"])
    p.add_argument("--octavo-args", default="", help="extra `octavo serve` flags, one string")
    p.add_argument("--octavo-variants", nargs="+", default=None, metavar="VARIANT",
                   help="A/B: one octavo-mp server per variant, each a string of `octavo serve` flags led by optional "
                        "NAME=VALUE environment words ('' = defaults), run in turns (see the module docstring)")
    p.add_argument("--rounds", type=int, default=1, help="with --octavo-variants: rounds over all variants")
    p.add_argument("--llama-server", default=None, help="path to llama.cpp's llama-server binary")
    p.add_argument("--threads", type=int, default=2, help="llama-server -t")
    p.add_argument("--num-slots", type=int, default=32, help="llama-server -np")
    p.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--name", default="serve_cpu")
    args = p.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]), "machine": machine(),
            "input_len": args.input_len, "output_len": args.output_len, "waves": args.waves}
    runs = []
    if args.octavo_variants:
        vruns = run_octavo_variants(args)
        path = os.path.join(args.out_dir, f"{args.name}{'_variants' if args.servers else ''}.json")
        with open(path, "w") as f:
            json.dump({**meta, "rounds": args.rounds, "runs": vruns}, f, indent=2)
        print(f"\nwrote {path}\n")
        print(variants_markdown(vruns))
        if not args.servers:
            return 0
    if "octavo-mp" in args.servers:
        runs.append(run_octavo("octavo", [], args))
    if "octavo-inproc" in args.servers:
        runs.append(run_octavo("octavo in-proc", ["--disable-frontend-multiprocessing"], args))
    if "llama-server" in args.servers:
        if args.llama_server and os.path.exists(args.llama_server):
            runs.append(run_llama_server(args))
        else:
            print("llama-server: not run (no --llama-server binary given)", file=sys.stderr)
    path = os.path.join(args.out_dir, f"{args.name}.json")
    with open(path, "w") as f:
        json.dump({**meta, "runs": runs}, f, indent=2)
    bench_serve.plot(runs, os.path.join(args.out_dir, f"{args.name}.png"))
    print(f"\nwrote {path} and {args.name}.png\n")
    print(markdown(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
