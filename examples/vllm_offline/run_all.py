"""Run every script in this folder (vLLM's offline examples with ``vllm`` swapped for ``octavo``), each in its
own process with a time limit, and print one JSON line per example: name, ok, seconds, last line of output.

    python examples/vllm_offline/run_all.py [--timeout 300] [--json results.json]
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--json", default=None)
    p.add_argument("names", nargs="*")
    args = p.parse_args()
    results = []
    for script in sorted(HERE.glob("*.py")):
        if script.name == "run_all.py" or (args.names and script.stem not in args.names):
            continue
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                                  timeout=args.timeout)
            ok, out = proc.returncode == 0, (proc.stdout + proc.stderr).strip().splitlines()
        except subprocess.TimeoutExpired:
            ok, out = False, ["timed out"]
        tail = next((ln for ln in reversed(out) if ln.strip() and "it/s" not in ln and "s/it" not in ln
                     and "Processed prompts" not in ln and " INFO " not in ln), "")
        results.append({"example": script.stem, "ok": ok, "seconds": round(time.perf_counter() - t0, 1),
                        "last_line": tail[-160:]})
        print(json.dumps(results[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
