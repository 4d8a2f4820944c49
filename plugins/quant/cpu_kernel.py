"""fp32 CPU kernels for group-quantized weights (int4 and int8, groups of 32), built once with the C compiler.

Why: torch's CPU int4 kernel (``_weight_int4pack_mm_for_cpu``) is fast only with bf16 activations, bf16
scales and a bf16 output; those three roundings flip greedy answers of the embedded SmolLM2 model
(benchmarks/quant_cpu_accuracy.py measures each). These kernels read the packed 4-bit (or 8-bit) weight
and compute in fp32 (activations, scales, accumulation, output), so the quantized path matches the fp32
run on the dequantized weights to fp32 rounding, while still reading 0.5 (or 1) byte per weight:

    y[m, n] = sum_g s[n, g] * sum_{k in g} q[n, k] * x[m, k] + z[n, g] * sum_{k in g} x[m, k]

    int4: w4 uint8 [N, K / 2], group g's 16 bytes hold element j (low nibble) and j + 16 (high nibble)
    int8: w8 int8  [N, K]                                     (scales s [N, K / 32], zeros z [N, K / 32])

Few rows (decode) run the fused kernel; many rows (prefill) dequantize the weight to fp32 once per call
and use torch's GEMM, whose cost is then amortised over the rows (as vLLM's AWQ path does above 256
tokens). The C source (:mod:`.cpu_kernel_src`) is compiled with ``$CC`` (default ``cc``) ``-O3 -march=native -fopenmp`` into
``$OCTAVO_CACHE_DIR/kernels`` on first use and loaded with ctypes (no torch headers, ~1 s).
:func:`library` returns None with the reason when no compiler is there; callers then say what they use.
"""

from __future__ import annotations

import ctypes
import logging
import platform

import torch

from octavo.plugins.quant import cpu_dense_rows, cpu_int8act_ops
from octavo.plugins.quant.cpu_build import cached_library, compile_shared_library  # noqa: F401  (re-exported)
from octavo.plugins.quant.cpu_kernel_src import C_SOURCE

logger = logging.getLogger(__name__)

#: at most this many rows use the fused kernel; more rows dequantize once and use torch's GEMM.
FUSED_MAX_ROWS = 16
GROUP = 32

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"] + (
    ["-mprefer-vector-width=512"] if platform.machine() in ("x86_64", "AMD64") else [])  # an x86-only flag
_P, _I = ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {"q4_gemm": ([_P, _I, _I, _P, _P, _P, _I, _P, _I], None), "q8_gemm": ([_P, _I, _I, _P, _P, _I, _P, _I], None),
               "q4_dequant": ([_P, _P, _P, _I, _I, _P, _I], None), "q8_dequant": ([_P, _P, _I, _I, _P, _I], None)}
_state: dict[str, object] = {}


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None (the reason is in :func:`unavailable_reason`). Built once per process.
    ``OCTAVO_CPU_QUANT_KERNEL=0`` disables them."""
    return cached_library(_state, C_SOURCE, "octavo_q", _FLAGS, _SIGNATURES, switch="OCTAVO_CPU_QUANT_KERNEL")


def unavailable_reason() -> str | None:
    library()
    return _state.get("why")  # type: ignore[return-value]


def pack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """Canonical ``uint8 [N, K]`` (0..15) -> ``uint8 [N, K / 2]``: per group of 32, byte j = j | (j + 16) << 4."""
    n, k = qweight.shape
    g = qweight.reshape(n, k // GROUP, 2, 16)
    return (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def per_32(t: torch.Tensor, k: int) -> torch.Tensor:
    """Per-group ``[N, K / g]`` values repeated to groups of 32 (``g`` a multiple of 32), float32 contiguous."""
    return t.float().repeat_interleave(k // GROUP // t.shape[1], 1).contiguous()


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def int4_linear(x: torch.Tensor, w4: torch.Tensor, s: torch.Tensor, z: torch.Tensor,
                act8: bool = False) -> torch.Tensor:
    """``x [m, K]`` (any float dtype) times the int4 weight ``w = q * s + z`` -> float32 ``[m, N]``.

    ``act8``: the caller accepts int8 activations (per block of 32, llama.cpp's Q8 math; the GGUF methods
    do): every row count then runs :mod:`.cpu_int8act`'s integer-dot kernel (batch-invariant: a row's output
    does not depend on the other rows) unless ``OCTAVO_CPU_INT8_ACT=0``.
    Otherwise, under ``torch.compile`` (the compiled CPU decode step) a few static rows are written in tensor
    ops (:func:`int4_linear_traced`) that inductor fuses into its own C++ loop; other shapes go through the
    custom op ``octavo::int4_linear`` (one extern call). Eager calls skip the op dispatch.
    """
    if act8 and cpu_int8act_ops.enabled():
        return cpu_int8act_ops.int4_linear(x, w4, s, z)
    if torch.compiler.is_compiling():
        if _traceable_rows(x):
            return int4_linear_traced(x, w4, s, z)
        return _int4_op(x, w4, s, z)
    return _int4_linear(x, w4, s, z)


def int8_linear(x: torch.Tensor, w8: torch.Tensor, s: torch.Tensor, act8: bool = False) -> torch.Tensor:
    """``x [m, K]`` times the int8 weight ``w = q * s`` (a scale per group of 32) -> float32 ``[m, N]``
    (``act8``: see :func:`int4_linear`)."""
    if act8 and cpu_int8act_ops.enabled():
        return cpu_int8act_ops.int8_linear(x, w8, s)
    if torch.compiler.is_compiling():
        if _traceable_rows(x):
            return int8_linear_traced(x, w8, s)
        return _int8_op(x, w8, s)
    return _int8_linear(x, w8, s)


#: under torch.compile, at most this many (static) rows use the tensor-op form below; it reads the weight once
#: per row, so more rows go through the custom op (which dequantizes once and runs a GEMM past 16 rows).
TRACED_MAX_ROWS = 4


def _traceable_rows(x: torch.Tensor) -> bool:
    m = x.shape[0]
    return isinstance(m, int) and m <= TRACED_MAX_ROWS


def _realized(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a contiguous fp32 buffer that inductor must write before the linear reads it.

    Why: inductor inlines a pointwise producer (RMSNorm, SiLU-and-mul) into its consumer's loop, and the
    consumer here is a reduction per output row, so it recomputed the norm (or the SiLU's exp) once per output
    row: N times per input element. ``inductor_force_stride_order`` is inductor's own "materialize with these
    strides" primitive (a no-op in eager when the strides already match)."""
    x = x.float().contiguous()
    return torch.ops.prims.inductor_force_stride_order(x, x.stride())


def int4_linear_traced(x: torch.Tensor, w4: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """:func:`int4_linear` in tensor ops, for a compiled graph: inductor fuses unpacking, scaling and the sum
    into one C++ reduction over ``K`` per output (parallel over ``N``), so a linear costs no extern call.

    Why not the custom op there: its Python dispatch costs 35-70 us a call on this VM (measured), and a
    SmolLM2 step has 210 linears; the fused loop reads the same 0.75 bytes per weight, in fp32 as the C kernel
    (the sums run in another order, so results agree to fp32 rounding, not bit for bit).
    """
    n, g = w4.shape[0], s.shape[1]
    xg = _realized(x).reshape(-1, 1, g, 2, 16)  # [m, 1, G, 2, 16]: elements j and j + 16 of each group
    # nibbles by float arithmetic, exact for 0..255: inductor's vector byte shift (``w >> 4``) is an emulation
    # of about ten shuffles on AVX-512, while convert, multiply by 1/16, floor and subtract are one op each
    wf = w4.view(1, n, g, 1, 16).float()  # [1, N, G, 1, 16]
    hi = torch.floor(wf * 0.0625)
    t = (wf - hi * 16) * xg[:, :, :, 0:1] + hi * xg[:, :, :, 1:2]  # [m, N, G, 1, 16]
    y = (t * s.view(1, n, g, 1, 1)).sum((2, 3, 4))  # [m, N]
    return y + (z.view(1, n, g) * xg.sum((3, 4))).sum(-1)


def int8_linear_traced(x: torch.Tensor, w8: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """:func:`int8_linear` in tensor ops (see :func:`int4_linear_traced`)."""
    n, g = w8.shape[0], s.shape[1]
    xg = _realized(x).reshape(-1, 1, g, GROUP)  # [m, 1, G, 32]
    return (w8.view(1, n, g, GROUP).float() * xg * s.view(1, n, g, 1)).sum((2, 3))  # [m, N]


def _int4_linear(x: torch.Tensor, w4: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    lib = library()
    if x.shape[0] > FUSED_MAX_ROWS:  # many rows: a kept dense copy + one GEMM (cpu_dense_rows.py, issue 18)
        y = cpu_dense_rows.int4_rows(x, w4, s, z, lambda: _dequant4(lib, w4, s, z))
        if y is not None:
            return y
    x = x.float().contiguous()
    (m, k), n = x.shape, w4.shape[0]
    threads = torch.get_num_threads()
    if m <= FUSED_MAX_ROWS and m * (k // GROUP) <= 16 * 1024:  # the kernel's group-sum buffer
        y = torch.empty(m, n, dtype=torch.float32)
        lib.q4_gemm(_ptr(x), m, k, _ptr(w4), _ptr(s), _ptr(z), n, _ptr(y), threads)
        return y
    return torch.nn.functional.linear(x, _dequant4(lib, w4, s, z))


def _dequant4(lib, w4: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    n, k = w4.shape[0], 2 * w4.shape[1]
    w = torch.empty(n, k, dtype=torch.float32)
    lib.q4_dequant(_ptr(w4), _ptr(s), _ptr(z), n, k, _ptr(w), torch.get_num_threads())
    return w


def _int8_linear(x: torch.Tensor, w8: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    lib = library()
    if x.shape[0] > FUSED_MAX_ROWS:  # many rows: a kept dense copy + one GEMM (cpu_dense_rows.py, issue 18)
        y = cpu_dense_rows.int8_rows(x, w8, lambda: _dequant8(lib, w8, s))
        if y is not None:
            return y
    x = x.float().contiguous()
    (m, k), n = x.shape, w8.shape[0]
    threads = torch.get_num_threads()
    if m <= FUSED_MAX_ROWS:
        y = torch.empty(m, n, dtype=torch.float32)
        lib.q8_gemm(_ptr(x), m, k, _ptr(w8), _ptr(s), n, _ptr(y), threads)
        return y
    return torch.nn.functional.linear(x, _dequant8(lib, w8, s))


def _dequant8(lib, w8: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    n, k = w8.shape
    w = torch.empty(n, k, dtype=torch.float32)
    lib.q8_dequant(_ptr(w8), _ptr(s), n, k, _ptr(w), torch.get_num_threads())
    return w


@torch.library.custom_op("octavo::int4_linear", mutates_args=())
def _int4_op(x: torch.Tensor, w4: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return _int4_linear(x, w4, s, z)


@_int4_op.register_fake
def _(x, w4, s, z):
    return x.new_empty((x.shape[0], w4.shape[0]), dtype=torch.float32)


@torch.library.custom_op("octavo::int8_linear", mutates_args=())
def _int8_op(x: torch.Tensor, w8: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return _int8_linear(x, w8, s)


@_int8_op.register_fake
def _(x, w8, s):
    return x.new_empty((x.shape[0], w8.shape[0]), dtype=torch.float32)

