"""Integer-dot CPU kernels: int8 activations (blocks of 32) times int4 / int8 weights, any number of rows.

Why: the fp32 kernels of :mod:`.cpu_kernel` convert every 4-bit weight to fp32 and multiply-add it, which
is compute-bound at about half the memory bandwidth here; llama.cpp instead quantizes the activation row to
int8 per block of 32 (its Q8_0 / Q8_1) and runs integer dot products. This module does the same for the
weights :mod:`.cpu_kernel` already holds (its layout, no repacking), for every row count::

    per activation row i and block g of 32:  d = amax|x| / 127,  xq = nearbyint(x / d)  (fp32, half-even;
                                             xq = 0 when d = 0),  ds = d * sum(xq)
    int4 (w = q * s + z, q in 0..15):        y[i, n] = sum_g s[n,g] d[i,g] * isum(q, xq) + z[n,g] ds[i,g]
    int8 (w = q * s):                        y[i, n] = sum_g s[n,g] d[i,g] * isum(q, xq)

``isum`` is an exact int32 dot of 32 products, so the result is the fp32 dot product of the dequantized weight
with the dequantized activation ``d * xq``, up to the order of the fp32 sums (tests: a float64 reference
of the same math, and the integer part bit for bit). Code paths, chosen when the C is compiled:

- AVX512-VNNI + AVX512BW: ``vpdpbusd`` on two blocks per 512-bit register (4-bit weights are unsigned
  0..15, so unsigned-weight x signed-activation needs no correction; int8 weights use ``xq + 128`` and
  subtract ``128 * sum(q)``, itself a ``vpdpbusd`` with a constant, exact for every int8).
- AVX2 (no AVX-512 VNNI): ``vpmaddubsw`` + ``vpmaddwd`` (4-bit: no saturation, 2 * 15 * 127 < 32767) and
  sign-extended ``vpmaddwd`` for int8 weights (exact).
- portable C elsewhere.

Batch invariance: each row is quantized on its own and its output is computed by the same operations in the
same order whether it is alone or one of thousands (rows are tiled, chunks of up to 4 share only the weight
loads), so a request's result does not depend on the other requests in its step (tests/quant/
test_cpu_int8act_batch_invariance.py checks it bit for bit, 1..64 rows and prefill-sized steps).

``isa="avx2"`` / ``"generic"`` (or ``OCTAVO_CPU_KERNEL_ISA``) builds the same source for an older target so
tests run every path on one machine. Numerics change (the activation is rounded to 8 bits per block, as in
llama.cpp): docs/quantization.md "int8 activations" gives the decision and the accuracy measured.
"""

from __future__ import annotations

import ctypes
import os
import platform

import torch

from octavo.plugins.quant.cpu_build import cached_library
from octavo.plugins.quant.cpu_int8act_src import C_SOURCE

GROUP = 32
#: build targets: "native" (this CPU), "avx2" (x86-64-v3: AVX2/FMA, no AVX-512), "generic" (portable C).
ISAS = ("native", "avx2", "generic")


_X86 = platform.machine() in ("x86_64", "AMD64")
_ISA_FLAGS = {"native": ["-march=native"] + (["-mprefer-vector-width=512"] if _X86 else []),
              "avx2": ["-march=x86-64-v3"], "generic": ["-march=x86-64"] if _X86 else []}
_libs: dict[str | None, object] = {}
_states: dict[str, dict] = {}


def _flags(isa: str) -> list[str]:
    # -ffp-contract=off: no implicit a * b + c -> fma, so every unrolled copy of a row's code rounds the same way
    # (batch invariance, see the C); the kernels' own fma intrinsics stay fused
    return ["-O3", "-fopenmp", "-shared", "-fPIC", "-ffp-contract=off", *_ISA_FLAGS[isa]]


def default_isa() -> str:
    """``OCTAVO_CPU_KERNEL_ISA`` (``native`` when unset); any other value than :data:`ISAS` is an error."""
    isa = os.environ.get("OCTAVO_CPU_KERNEL_ISA", "").strip() or "native"
    if isa not in ISAS:
        raise ValueError(f"OCTAVO_CPU_KERNEL_ISA={isa!r}: use one of {', '.join(ISAS)}")
    if isa != "native" and not _X86:
        raise ValueError(f"OCTAVO_CPU_KERNEL_ISA={isa!r} names an x86 target; this machine is {platform.machine()}")
    return isa


_P, _I = ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {"quant_act": ([_P, _I, _I, _I, _I, _P, _P, _P], None),
               "qa8_gemm": ([_I, _P, _I, _I, _I, _P, _P, _P, _I, _P, _I], _I),
               "q4a8_gemm_q": ([_P, _P, _P, _I, _I, _P, _P, _P, _I, _P, _I], _I),
               "q8a8_gemm_q": ([_P, _P, _I, _I, _P, _P, _I, _P, _I], _I),
               "kernel_path": ([], ctypes.c_char_p)}


def library(isa: str | None = None) -> ctypes.CDLL:
    """The kernels built for ``isa`` (default :func:`default_isa`), compiled once per process and target.
    Raises RuntimeError when it cannot be built (callers keep the fp32 kernels then)."""
    if isa is None:
        lib = _libs.get(None)
        if lib is None:
            lib = _libs[None] = library(default_isa())  # OCTAVO_CPU_KERNEL_ISA read once per process
        return lib  # type: ignore[return-value]
    if isa not in ISAS:
        raise ValueError(f"isa {isa!r}: use one of {', '.join(ISAS)}")
    state = _states.setdefault(isa, {})
    lib = cached_library(state, C_SOURCE, f"octavo_q8act_{isa}", _flags(isa), _SIGNATURES)
    if lib is None:
        raise RuntimeError(str(state["why"]))
    _libs[isa] = lib
    return lib


def kernel_path(isa: str | None = None) -> str:
    """Which code path the build for ``isa`` compiled in: ``avx512vnni``, ``avx2`` or ``generic``."""
    return library(isa).kernel_path().decode()


def _x_arg(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    if x.dtype == torch.bfloat16:
        return x.contiguous(), 1
    return x.float().contiguous(), 0


def _check(rc: int, m: int, k: int) -> None:
    if rc:
        raise ValueError(f"int8-activation kernel: {m} rows x {k} inputs refused ({rc}; inputs must be a multiple "
                         f"of {GROUP})")


def int4_linear(x: torch.Tensor, w4: torch.Tensor, s: torch.Tensor, z: torch.Tensor,
                isa: str | None = None) -> torch.Tensor:
    """``x [m, K]`` (fp32 or bf16) times :mod:`.cpu_kernel`'s int4 weight -> float32 ``[m, N]``."""
    x, bf16 = _x_arg(x)
    (m, k), n = x.shape, w4.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    _check(library(isa).qa8_gemm(4, x.data_ptr(), bf16, m, k, w4.data_ptr(), s.data_ptr(), z.data_ptr(), n,
                                 y.data_ptr(), torch.get_num_threads()), m, k)
    return y


def int8_linear(x: torch.Tensor, w8: torch.Tensor, s: torch.Tensor, isa: str | None = None) -> torch.Tensor:
    """``x [m, K]`` times :mod:`.cpu_kernel`'s int8 weight (a scale per group of 32) -> float32 ``[m, N]``."""
    x, bf16 = _x_arg(x)
    (m, k), n = x.shape, w8.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    _check(library(isa).qa8_gemm(8, x.data_ptr(), bf16, m, k, w8.data_ptr(), s.data_ptr(), None, n, y.data_ptr(),
                                 torch.get_num_threads()), m, k)
    return y


def nibble_order(k: int) -> torch.Tensor:
    """Index ``p`` with ``xq_nibble[:, j] == xq_natural[:, p[j]]``: the NIBBLE activation layout (see the C)."""
    ng, out, g0 = k // GROUP, [], 0
    while g0 < ng:
        c = 4 if ng - g0 >= 4 else (2 if ng - g0 >= 2 else 1)
        for half in (0, 16):
            for t in range(c):
                out.extend(range((g0 + t) * GROUP + half, (g0 + t) * GROUP + half + 16))
        g0 += c
    return torch.tensor(out, dtype=torch.int64)


def quantize_activation(x: torch.Tensor, nibble: bool = False, isa: str | None = None):
    """The kernel's own activation quantization: ``(xq int8 [m, K], d [m, K/32], ds [m, K/32])`` (tests)."""
    x, bf16 = _x_arg(x)
    m, k = x.shape
    xq = torch.empty(m, k, dtype=torch.int8)
    d, ds = torch.empty(m, k // GROUP), torch.empty(m, k // GROUP)
    library(isa).quant_act(x.data_ptr(), bf16, m, k, int(nibble), xq.data_ptr(), d.data_ptr(), ds.data_ptr())
    return xq, d, ds


def int4_from_quantized(xq, d, ds, w4, s, z, isa: str | None = None) -> torch.Tensor:
    """The int4 product on a given activation (NIBBLE layout; tests feed chosen ``xq`` / ``d`` to it)."""
    (m, k), n = xq.shape, w4.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    _check(library(isa).q4a8_gemm_q(xq.data_ptr(), d.data_ptr(), ds.data_ptr(), m, k, w4.data_ptr(), s.data_ptr(),
                                    z.data_ptr(), n, y.data_ptr(), torch.get_num_threads()), m, k)
    return y


def int8_from_quantized(xq, d, w8, s, isa: str | None = None) -> torch.Tensor:
    """The int8-weight product on a given activation (NATURAL layout)."""
    (m, k), n = xq.shape, w8.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    _check(library(isa).q8a8_gemm_q(xq.data_ptr(), d.data_ptr(), m, k, w8.data_ptr(), s.data_ptr(), n,
                                    y.data_ptr(), torch.get_num_threads()), m, k)
    return y
