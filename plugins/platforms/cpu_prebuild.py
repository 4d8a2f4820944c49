"""Compile the CPU platform's C kernels in parallel, in the background, before the first step asks for them.

Why (issue 18, cold start): every CPU kernel (paged attention, the fused batch-1 stack, quantized GEMMs, norm,
rotary, SiLU, argmax, grammar mask) is C built by ``plugins/quant/cpu_build.py`` on first use and cached under
``$OCTAVO_CACHE_DIR/kernels``. On a fresh cache the engine used to meet them one at a time, each build
blocking the model's profile run or its set-up: ~40 s of serial compiles on a 2-vCPU machine, most of it
the paged-attention kernel alone. ``CpuPlatform.install_shipped_kernels`` (before the model loads) calls
:func:`start`: one daemon thread per CPU compiles the list below, longest first, while the main thread loads
the model; a ``library()`` call that meets a build in flight waits for it (``compile_shared_library`` keeps
one build per file per process), one whose file exists just loads it. Nothing is loaded here (the libraries
must bind torch's OpenMP runtime, loaded by the caller), and a kernel a switch turns off is not built.

Ahead of time: ``python -m octavo.plugins.platforms.cpu_prebuild`` builds them all and waits (``make venv``
runs it), so a newcomer's first ``make serve`` finds them built.
"""

from __future__ import annotations

import importlib
import logging
import os
import queue
import sys
import threading
import time

from octavo.plugins.quant.cpu_build import collect_specs, compile_shared_library

logger = logging.getLogger("octavo.platforms.cpu")

#: ``(module, function)`` whose call builds a kernel through ``cached_library``; the longest build first
#: (the paged-attention kernel is ~70 % of all the compile time). A module that is missing is skipped.
KERNELS = (
    ("octavo.plugins.attention._cpu_paged_kernel", "library"),
    ("octavo.plugins.platforms.cpu_fused_decode", "library"),
    ("octavo.plugins.quant.cpu_int8act", "library"),
    ("octavo.plugins.platforms.cpu_bf16_gemm", "library"),  # bf16 linears on AVX512-BF16 CPUs without AMX
    ("octavo.plugins.quant.cpu_kernel", "library"),
    ("octavo.plugins.platforms.cpu_norm", "library"),
    ("octavo.plugins.platforms.cpu_silu", "library"),
    ("octavo.plugins.platforms.cpu_rope", "library"),
    ("octavo.plugins.platforms.cpu_argmax", "library"),
    ("octavo.plugins.platforms.cpu_grammar_mask", "library"),
)

_started: list[threading.Thread] = []
_seconds: dict[str, float] = {}  # stem -> compile (or cache check) seconds, for the log and the tests
_errors: dict[str, str] = {}


def specs() -> list[tuple[str, str, list[str]]]:
    """What :data:`KERNELS` would build here: ``(source, stem, flags)``, in order (nothing is compiled)."""
    out = []
    for module_name, fn in KERNELS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a copy of the plugins without that kernel
            continue
        out += collect_specs(getattr(module, fn))
    return out


def _worker(jobs: queue.Queue) -> None:
    while True:
        try:
            source, stem, flags = jobs.get_nowait()
        except queue.Empty:
            return
        t0 = time.perf_counter()
        try:
            compile_shared_library(source, stem, flags)
        except (OSError, RuntimeError) as e:  # the kernel's own library() call reports it again, and falls back
            _errors[stem] = str(e)
        _seconds[stem] = time.perf_counter() - t0


def start(workers: int | None = None) -> int:
    """Start building the kernels in daemon threads (at most once per process); returns how many threads.
    ``OCTAVO_CPU_PREBUILD=0`` turns this off (each kernel is then built when first used)."""
    from octavo.env_flags import env_switch

    if _started or not env_switch("OCTAVO_CPU_PREBUILD", True):
        return 0
    jobs: queue.Queue = queue.Queue()
    for spec in specs():
        jobs.put(spec)
    n = min(workers or len(os.sched_getaffinity(0)), jobs.qsize())
    for i in range(n):
        thread = threading.Thread(target=_worker, args=(jobs,), name=f"octavo-cpu-prebuild-{i}", daemon=True)
        thread.start()
        _started.append(thread)
    return n


def wait(timeout: float | None = None) -> dict[str, float]:
    """Wait for :func:`start`'s builds; returns ``{stem: seconds}`` of those done."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread in _started:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return dict(_seconds)


def main(argv: list[str] | None = None) -> int:
    """Build every kernel now (``make venv``); prints each one's seconds; exit 1 if one failed."""
    t0 = time.perf_counter()
    n = start()
    done = wait()
    for stem, s in sorted(done.items(), key=lambda kv: -kv[1]):
        print(f"{stem:<28}{s:7.1f} s" + (f"  FAILED: {_errors[stem]}" if stem in _errors else ""))
    print(f"{len(done)} CPU kernels ready in {time.perf_counter() - t0:.1f} s ({n} parallel builds)")
    return 1 if _errors else 0


if __name__ == "__main__":
    sys.exit(main())
