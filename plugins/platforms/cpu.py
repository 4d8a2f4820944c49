"""The built-in CPU platform: cores, memory and native dtypes read from this machine, ``gloo`` collectives.

Always available, so it is the last resort of platform selection. Memory honours a cgroup (container)
limit when one is set, because psutil reports the host's memory. Dtypes come from the CPU's feature flags:
bfloat16 only where the CPU computes it natively (x86 ``avx512_bf16`` / ``amx_bf16``, Arm ``bf16``),
float16 where it has half-precision arithmetic (x86 ``avx512_fp16``, Arm ``asimdhp``). Importing this
module imports nothing heavy: the plugin manager imports it in every process.
"""

from __future__ import annotations

import functools
import os
import platform as _platform
import sys

from octavo.errors import ConfigError
from octavo.platform import Availability, ModelHandle, Platform, PlatformCapabilities, PreparedModel

_CGROUP_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
_CGROUP_USAGE = ("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes")
#: ``1`` compiles the decode step (plugins/platforms/cpu_compiled.py); unset or ``0``: eager.
COMPILE_ENV = "OCTAVO_CPU_COMPILE"
_NATIVE_BF16 = {"avx512_bf16", "amx_bf16", "bf16"}  # x86 AVX512-BF16 / AMX, Arm BF16


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo (empty off Linux)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    if info:
                        break
                    continue
                key, _, value = line.partition(":")
                info.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    return info


def cpu_flags() -> set[str]:
    """Feature flags of this CPU (x86 ``flags`` or Arm ``features`` of /proc/cpuinfo)."""
    info = _cpuinfo()
    return set((info.get("flags") or info.get("features") or "").split())


def _read_int(paths: tuple[str, ...]) -> int | None:
    for path in paths:
        try:
            with open(path) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw.isdigit():
            return int(raw)
    return None


def _cgroup_limit() -> int | None:
    limit = _read_int(_CGROUP_FILES)
    # cgroup v1 reports "no limit" as a huge page-aligned number
    return limit if limit is not None and limit < (1 << 60) else None


class CpuPlatform(Platform):
    """The host CPU as one device."""

    name = "cpu"
    device_type = "cpu"
    distributed_backend = "gloo"
    priority = -100  # always available, so the last resort of default selection

    @classmethod
    def is_available(cls) -> Availability:
        return Availability(True)

    def device_count(self) -> int:
        return 1

    def num_cores(self) -> int:
        """Logical cores this process may run on (its affinity mask, e.g. a container's cpuset)."""
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # macOS, Windows
            return os.cpu_count() or 1

    def num_physical_cores(self) -> int:
        """Physical cores available to this process: the default torch thread count."""
        import psutil

        physical = psutil.cpu_count(logical=False) or self.num_cores()
        logical = psutil.cpu_count(logical=True) or physical
        # scale by the affinity mask: a container given 2 of 64 logical cores gets 1-2 physical ones
        return max(1, min(physical, round(physical * self.num_cores() / logical)))

    def device_name(self, index: int = 0) -> str:
        model = _cpuinfo().get("model name") or _platform.processor() or _platform.machine() or "CPU"
        return f"{model} ({self.num_cores()} cores)"

    def memory_total(self, index: int = 0) -> int:
        import psutil

        total = psutil.virtual_memory().total
        limit = _cgroup_limit()
        return min(total, limit) if limit else total

    def memory_free(self, index: int = 0) -> int:
        import psutil

        free = psutil.virtual_memory().available
        limit, used = _cgroup_limit(), _read_int(_CGROUP_USAGE)
        if limit and used is not None:
            free = min(free, max(0, limit - used))
        return min(free, self.memory_total(index))

    def supported_dtypes(self) -> list[str]:
        flags = cpu_flags()
        dtypes = ["float32"]
        if flags & _NATIVE_BF16:  # x86 AVX512-BF16 / AMX, Arm BF16
            dtypes.append("bfloat16")
        if flags & {"avx512_fp16", "amx_fp16", "asimdhp"}:  # x86 AVX512-FP16, Arm half-precision SIMD
            dtypes.append("float16")
        if sys.platform == "darwin" and _platform.machine() == "arm64":  # Apple silicon: fp16 and bf16
            dtypes += [d for d in ("bfloat16", "float16") if d not in dtypes]
        return dtypes

    def default_dtype(self) -> str:
        """bfloat16 where the CPU computes it natively (AMX / AVX512-BF16 / Arm BF16), else float32.

        Why: on such CPUs bf16 linears ran 2.2-3.9x faster than fp32 at batch 8-64 and the same at batch 1
        (docs/performance.md, CPU decode); the fp32 parity tests pin ``dtype="float32"``."""
        return "bfloat16" if cpu_flags() & _NATIVE_BF16 else "float32"

    def install_shipped_kernels(self) -> int | None:
        """Start building this platform's C kernels in parallel in the background (``cpu_prebuild.py``; a fresh
        cache otherwise builds them one by one inside the first steps: ~40 s). Returns the build threads."""
        try:
            from .cpu_prebuild import start  # relative, like cpu_compiled
        except ImportError:  # a copy of this plugin without that sibling: each kernel builds on first use
            return None
        return start() or None

    def prepare_model(self, handle: ModelHandle) -> PreparedModel | None:
        """With ``OCTAVO_CPU_COMPILE=1``: a compiled decode-step runner (``cpu_compiled.py``), compiled here.
        With ``OCTAVO_CPU_FUSED_DECODE=1``: batch-1 decode steps as one C call (``cpu_fused_decode.py``).

        Opt-in because compiling costs minutes the first time (inductor's disk cache shortens later starts)
        and the start-up and CI budgets are seconds. Refused, never skipped, when it cannot apply.
        Always (same bits as the torch ops they replace): bfloat16 dense linears on weights packed once for oneDNN
        (``cpu_packed_linear.py``), rotary embeddings and SiLU-and-mul in one C pass each (``cpu_rope.py``,
        ``cpu_silu.py``)."""
        self._install_kernels(handle)
        prepared = self._prepare_compiled(handle)
        try:
            from .cpu_fused_decode_setup import with_fused_decode  # relative, like cpu_compiled
        except ImportError as e:  # a copy of this plugin without that sibling: refuse the switch, never ignore it
            if os.environ.get("OCTAVO_CPU_FUSED_DECODE", "0") not in ("", "0"):
                raise ConfigError("OCTAVO_CPU_FUSED_DECODE is set but this CPU platform has no fused decode step") from e
            return prepared
        return with_fused_decode(handle, prepared)

    def _install_kernels(self, handle: ModelHandle) -> None:
        if os.environ.get(COMPILE_ENV, "0") not in ("", "0"):
            return  # inductor traces the torch ops themselves
        try:
            from .cpu_packed_linear import pack_dense_linears  # relative, like cpu_compiled
            from .cpu_rope import install_rope
            from .cpu_silu import install_silu
        except ImportError:  # a copy of this plugin without those siblings: the torch ops (the same bits)
            return
        pack_dense_linears(handle.model, rows_hint=min(max(handle.max_num_seqs, 1), 256))
        install_rope(handle.model, handle.dtype)
        install_silu(handle.model, handle.dtype)
        try:
            from .cpu_norm import install_norm  # the fused batch-1 stack's norm arithmetic (cpu_fused_decode)
        except ImportError:
            return
        install_norm(handle.model, handle.dtype)

    def _prepare_compiled(self, handle: ModelHandle) -> PreparedModel | None:
        if os.environ.get(COMPILE_ENV, "0") in ("", "0"):
            return None
        if os.environ[COMPILE_ENV] != "1":
            raise ConfigError(f"{COMPILE_ENV}={os.environ[COMPILE_ENV]!r}: use 1 (compile the CPU decode step) or 0")
        if handle.enforce_eager:
            raise ConfigError(f"{COMPILE_ENV}=1 and enforce_eager are both set; unset one of them")
        from .cpu_compiled import (  # relative: a verbatim copy of this plugin carries its sibling
            MAX_COMPILED_BATCH,
            CpuCompiledDecodeRunner,
            supports_compiled_decode,
        )

        reason = supports_compiled_decode(handle.model)
        if reason:
            raise ConfigError(f"{COMPILE_ENV}=1: this model cannot run the compiled CPU decode step: {reason}")
        runner = CpuCompiledDecodeRunner(handle.model, handle.block_size, min(handle.max_num_seqs, MAX_COMPILED_BATCH),
                                         handle.dtype)
        seconds = runner.warm_up()
        return PreparedModel(step_runner=runner, notes={"compiled_decode": {
            "compile_seconds": {k: round(v, 1) for k, v in seconds.items()}, "max_batch": runner.max_batch}})

    def make_greedy_argmax(self):
        """All-greedy batches' ``argmax`` in one C pass over the float32 logits (``cpu_argmax.py``; torch's
        ``argmax`` where it cannot be built or ``OCTAVO_CPU_C_ARGMAX=0``): exactly torch's result."""
        try:
            from .cpu_argmax import greedy_argmax, library
        except ImportError:  # a copy of this plugin without that sibling: torch's argmax
            return None
        return greedy_argmax if library() is not None else None

    def make_grammar_mask_apply(self):
        """Structured outputs' token masks applied in one C pass over the packed words (``cpu_grammar_mask.py``,
        built on first use; where it cannot be built the core logs why and applies them itself, same bits)."""
        try:
            from .cpu_grammar_mask import apply_bitmask_cpu_  # relative, like cpu_compiled
        except ImportError:  # a copy of this plugin without that sibling: the core's own apply (same bits)
            return None
        return apply_bitmask_cpu_

    def capabilities(self) -> PlatformCapabilities:
        return PlatformCapabilities(
            graphs=False,
            fp8=False,
            pinned_memory=False,
            memory_profiling=False,
            extra={"num_cores": self.num_cores(), "num_physical_cores": self.num_physical_cores(),
                   "isa": sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16",
                                                "neon", "asimd", "asimdhp", "bf16", "sve"})},
        )
