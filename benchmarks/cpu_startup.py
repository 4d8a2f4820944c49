"""``octavo serve`` start-up time: process start to the first ``200`` from ``/v1/models``, on the embedded model,
and to the end of the first completion after it (a 4-token greedy answer: "ready" must mean it can be served).

Why: issue 18 wants the server ready in under 2 s. Each round starts ``octavo serve`` with a fresh
``OCTAVO_CACHE_DIR`` (cold: the GGUF tokenizer is converted, the C kernels built and the processed weights
cached) and once more on the same folder (warm: all three loaded from it), and also times the imports and
tokenizer paths of the front end in
a child process. Reports medians over ``--repeats`` rounds (the machine may be shared: compare the
columns of one run).

    python benchmarks/cpu_startup.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from cpu_record import run_info, write_record  # benchmarks/ is sys.path[0] when run as a script


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the start-phase lines ``octavo serve`` (front end) and its engine core log (docs/loading.md)
_PHASE_LINES = {"core": re.compile(r"engine start took [\d.]+ s: (.*)$"), "front end": re.compile(r"octavo.serve: start: (.*)$")}


def _phases(log: str) -> dict:
    """``{"core": {phase: s}, "front end": {...}, "timeline": {...}}`` from a serve log. The timeline puts both
    processes on the front end's clock (seconds since it started): the core is ready at its spawn time plus the
    sum of its phases; when the front end's own work (tokenizer, server imports) ends later, it is the path."""
    out: dict = {}
    for line in log.splitlines():
        for who, pattern in _PHASE_LINES.items():
            m = pattern.search(line)
            if m:
                parts = [part.strip().rsplit(" ", 2) for part in m.group(1).split("; ")]
                out[who] = {p[0]: float(p[1]) for p in parts if len(p) == 3 and p[2] == "s"}
    front, core = out.get("front end", {}), out.get("core", {})
    spawned = front.get("core process spawned at")
    own = front.get("front end's own work (tokenizer + server imports) done at")
    if spawned is not None and core:
        out["timeline"] = {"core spawned at": spawned, "core ready at": round(spawned + sum(core.values()), 2)}
        if own is not None:
            out["timeline"]["front end's own work done at"] = own
    return out


def first_completion(port: int) -> str:
    """One greedy 4-token completion (the answer text): what "ready" must mean (the server binds its port only
    once the engine core is built, so the first 200 of /v1/models already implies this can run)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as r:
        model = json.loads(r.read())["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["text"]


def server_env(cache_dir: str, **extra: str) -> dict:
    """The server's environment: this one, its own cache folder, and Python's bytecode cache on (a shell with
    ``PYTHONDONTWRITEBYTECODE=1``, as on the team machines, recompiles every edited octavo module at every
    start: ~0.1-0.3 s that a fresh install pays once)."""
    env = dict(os.environ, OCTAVO_CACHE_DIR=cache_dir, OCTAVO_DISABLE_PROGRESS="1", **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _cpu_s(pid: int) -> dict:
    """CPU seconds (user + system) the front end and its engine-core child have used so far: on a shared machine
    these move far less with the load than the wall seconds do, so a loaded A/B compares them too."""
    import psutil

    try:
        front = psutil.Process(pid)
        out = {"front end": sum(front.cpu_times()[:2])}
        for child in front.children():
            out["core"] = out.get("core", 0.0) + sum(child.cpu_times()[:2])
        return {k: round(v, 3) for k, v in out.items()}
    except psutil.Error:
        return {}


def time_serve(cache_dir: str, extra: list[str], timeout: float = 300.0, **env_extra: str) -> tuple[float, float, dict]:
    """Seconds from spawning ``octavo serve`` to the first 200 of /v1/models and to the end of the first
    completion after it, and the phases it logged (with ``"cpu_s_until_ready"``: CPU seconds of each process)."""
    port = free_port()
    env = server_env(cache_dir, **env_extra)
    cmd = [sys.executable, "-m", "octavo.cli.main", "serve", "--port", str(port), "--max-model-len", "2048",
           "--uvicorn-log-level", "warning", *extra]
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while time.perf_counter() - t0 < timeout:
                if proc.poll() is not None:
                    raise RuntimeError(f"octavo serve exited with {proc.returncode}: {' '.join(cmd)}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1) as r:
                        if r.status == 200:
                            ready = time.perf_counter() - t0
                            cpu = _cpu_s(proc.pid)
                            break
                except OSError:
                    time.sleep(0.02)
            else:
                raise TimeoutError("octavo serve was not ready in time")
            text = first_completion(port)
            first = time.perf_counter() - t0
            if not text.strip():
                raise RuntimeError("the first completion came back empty")
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.seek(0)
        return ready, first, {**_phases(log.read()), "cpu_s_until_ready": cpu}


_PARTS = r"""
import json, os, sys, time
t = {}
t0 = time.perf_counter(); import torch; t["import torch"] = time.perf_counter() - t0
t0 = time.perf_counter(); import transformers, tokenizers; t["import transformers"] = time.perf_counter() - t0
t0 = time.perf_counter(); import octavo.cli.main, octavo.server; t["import octavo cli+server"] = time.perf_counter() - t0
from octavo.core.loader import default_model_path
from octavo.core.loader import tokenizer as tk
from octavo.core.loader.gguf_file import gguf_tokenizer
p = default_model_path()
t0 = time.perf_counter(); tk.gguf_tokenizer_cache_key(p); t["tokenizer cache key (sha256)"] = time.perf_counter() - t0
t0 = time.perf_counter(); gguf_tokenizer(p); t["tokenizer: convert from GGUF"] = time.perf_counter() - t0
tk.cached_gguf_tokenizer(p)
t0 = time.perf_counter(); tk.cached_gguf_tokenizer(p); t["tokenizer: cached (key + load)"] = time.perf_counter() - t0
print(json.dumps(t))
"""


def time_parts(cache_dir: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PARTS], env=server_env(cache_dir),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--serve-args", default="", help="extra arguments for octavo serve (one string)")
    ap.add_argument("--out", default="benchmarks/results/cpu_startup.json")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one start may take (a loaded machine's "
                    "cold start compiles the C kernels for minutes)")
    ap.add_argument("--cold-ab", action="store_true",
                    help="also a cold row with OCTAVO_CPU_PREBUILD=0 (C kernels built one by one when first used)")
    args = ap.parse_args(argv)
    extra = args.serve_args.split()
    rows = {"cold cache": [], "warm cache": []}
    if args.cold_ab:
        rows["cold cache, no parallel prebuild"] = []
    firsts = {k: [] for k in rows}  # spawn -> first completion done
    parts, logged = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as d:
            for name in ("cold cache", "warm cache"):
                ready, first, phases = time_serve(d, extra, args.timeout)
                rows[name].append(ready)
                firsts[name].append(first)
                logged.append({"cache": name, **phases})
            parts.append(time_parts(d))
        if args.cold_ab:  # the same cold start, side by side, with the kernels built where first used
            with tempfile.TemporaryDirectory() as d:
                name = "cold cache, no parallel prebuild"
                ready, first, phases = time_serve(d, extra, args.timeout, OCTAVO_CPU_PREBUILD="0")
                rows[name].append(ready)
                firsts[name].append(first)
                logged.append({"cache": name, **phases})
        print({k: round(v[-1], 2) for k, v in rows.items()}, "first completion done:",
              {k: round(v[-1], 2) for k, v in firsts.items()}, {k: round(v, 2) for k, v in parts[-1].items()},
              flush=True)
        print("  logged phases (warm):", logged[-1], flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    med.update({f"{k}, first completion done": statistics.median(v) for k, v in firsts.items()})
    med.update({f"{k}, CPU until ready, {who}": statistics.median(cpu[who] for cpu in cpus)
                for k in rows for who in ("front end", "core")
                if (cpus := [e["cpu_s_until_ready"] for e in logged if e["cache"] == k and who in e["cpu_s_until_ready"]])})
    med_parts = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
    for k, v in {**med, **med_parts}.items():
        print(f"{k:<48}{v:8.2f} s")
    record = {"card": f"CPU, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the end",
              **run_info(__file__, argv), "python_bytecode_cache": "on for the servers (PYTHONDONTWRITEBYTECODE unset)",
              "results": {"serve_ready_s": rows, "first_completion_s": firsts, "median_s": med, "parts_median_s": med_parts,
                          "logged_phases_s": logged}}
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
