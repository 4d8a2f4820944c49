"""What the CPU benchmarks' JSON records share: the run (date, command, commit), the CPU's ISA flags that decide
which kernels run, and how a record is written. One copy here, so the records stay comparable across scripts.

    from cpu_record import isa, run_info, write_record   # benchmarks/ is sys.path[0] when run as a script

    record = {**run_info(__file__, argv), "results": ...}
    write_record(args.out, record)
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

#: the flags that pick a CPU kernel path (AVX-512 GEMMs/attention, VNNI int8, bf16 dot products, AMX tiles)
ISA_FLAGS = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8"})


def isa() -> list[str]:
    """This CPU's kernel-relevant ISA flags, sorted (empty where /proc/cpuinfo is missing)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return []
    return sorted(flags & ISA_FLAGS)


def commit() -> str:
    """The short commit of the tree the benchmark ran on ("" outside a git checkout)."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def run_info(script: str, argv: list[str] | None) -> dict:
    """``date`` (UTC, minutes), ``command`` (how to rerun it) and ``commit`` of this run.

    Args:
        script: the benchmark's ``__file__``.
        argv: the arguments ``main`` was given (``None``: the command line's).
    """
    args = sys.argv[1:] if argv is None else argv
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
            "command": f"python benchmarks/{os.path.basename(script)} " + " ".join(args),
            "commit": commit()}


def write_record(path: str, record: dict) -> None:
    """Write ``record`` as indented JSON, creating the folder."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
