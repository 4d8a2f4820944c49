"""SiLU-and-mul on a CPU in one C pass, the same bits as ``octavo.nn.SiluAndMul`` (issue 18, offline batch 64).

Why: ``F.silu(gate) * up`` is two passes over the MLP's widest activation (a 2,048-token bf16 prefill step: ~6 %
of the step in ``silu`` and part of the ``mul`` share, 1 thread; docs/performance.md "Offline 64 x 128/128,
session 7"). Torch computes ``silu`` on AVX-512 as ``x / (1 + exp(-x))`` in float32 with SLEEF's ``expf``
(u10: ``Sleef_expf16_u10``) for whole vectors, rounds to the dtype, then multiplies by ``up`` in float32 and
rounds again. This kernel does those same operations per element: SLEEF's ``expf`` algorithm transcribed with
the same fused multiply-adds (``sleef_expf16``, :mod:`.cpu_sleef_src`), an IEEE division, bf16 rounding to nearest even. It is
installed only where it gives the module's bits: at install every bf16 value as ``gate`` (all 65,536) and random
float32 values are checked against the module's forward, and rows must be a multiple of 64 wide (torch runs
the last ``< 2 x vector`` elements of a row with the C library's ``exp``, which this does not copy).

Installed by the CPU platform's ``prepare_model`` (with the rotary kernel; not with ``OCTAVO_CPU_COMPILE=1``);
``OCTAVO_CPU_FUSED_SILU=0`` keeps the torch form. A call it does not cover runs the module's forward.
"""

from __future__ import annotations

import ctypes
import logging
import types

import torch

from octavo.env_flags import env_switch
from octavo.plugins.platforms.cpu_sleef_src import SLEEF_EXPF16
from octavo.plugins.quant.cpu_build import cached_library

logger = logging.getLogger(__name__)

C_SOURCE = r"""
#include <stdint.h>
#if defined(__AVX512F__)
#include <immintrin.h>

""" + SLEEF_EXPF16 + r"""

static inline __m512 silu16(__m512 g) {
    __m512 e = sleef_expf16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

/* float32 -> bf16 bits, nearest even, NaN -> 0xFFFF (torch's vectorized conversion), 16 lanes */
static inline __m256i to_bf16(__m512 f) {
    __m512i u = _mm512_castps_si512(f);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)),
                                 _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    r = _mm512_srli_epi32(r, 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), _mm512_set1_epi32(0xFFFF));
    return _mm512_cvtepi32_epi16(r);
}
static inline __m512 from_bf16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
#endif

/* out[i, :h] = silu(x[i, :h]) * x[i, h:2h] (rows of x xstride elements apart; out contiguous); h % 16 == 0.
   Returns -1 on a build without AVX-512 (nothing written). */
int silu_mul(const void* x, long xstride, long h, long n, int bf16, void* out, int nthreads) {
#if defined(__AVX512F__)
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && n * h >= 65536)
    for (long i = 0; i < n; i++) {
        if (bf16) {
            const uint16_t* g = (const uint16_t*)x + i * xstride;
            uint16_t* o = (uint16_t*)out + i * h;
            for (long j = 0; j < h; j += 16) {
                __m512 s = from_bf16(g + j);
                __m256i sb = to_bf16(silu16(s));  /* F.silu's bf16 result */
                __m512 sr = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(sb), 16));
                _mm256_storeu_si256((__m256i*)(o + j), to_bf16(_mm512_mul_ps(sr, from_bf16(g + h + j))));
            }
        } else {
            const float* g = (const float*)x + i * xstride;
            float* o = (float*)out + i * h;
            for (long j = 0; j < h; j += 16)
                _mm512_storeu_ps(o + j, _mm512_mul_ps(silu16(_mm512_loadu_ps(g + j)), _mm512_loadu_ps(g + h + j)));
        }
    }
    return 0;
#else
    (void)x; (void)xstride; (void)h; (void)n; (void)bf16; (void)out; (void)nthreads;
    return -1;
#endif
}
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-strict-aliasing", "-shared", "-fPIC"]
_state: dict[str, object] = {}
SWITCH = "OCTAVO_CPU_FUSED_SILU"
#: torch's vectorized loop covers whole pairs of vectors (2 x 32 bf16 / 2 x 16 fp32); the rest is scalar libm
ROW_MULTIPLE = 64


def library() -> ctypes.CDLL | None:
    p, lg, i = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    return cached_library(_state, C_SOURCE, "octavo_cpu_silu", _FLAGS,
                          {"silu_mul": ([p, lg, lg, lg, i, p, i], i)}, switch=SWITCH)


def silu_mul(x: torch.Tensor) -> torch.Tensor | None:
    """``silu(x[..., :h]) * x[..., h:]`` for a 2-D bf16/fp32 CPU ``x`` with unit inner stride; None when it does
    not apply (the caller runs the torch form)."""
    if (x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float32) or x.device.type != "cpu"
            or x.stride(1) != 1 or x.shape[1] % (2 * ROW_MULTIPLE)):
        return None
    h = x.shape[1] // 2
    out = torch.empty(x.shape[0], h, dtype=x.dtype)
    if library().silu_mul(x.data_ptr(), x.stride(0), h, x.shape[0], int(x.dtype == torch.bfloat16), out.data_ptr(),
                          torch.get_num_threads()):
        return None
    return out


def silu_forward(self, x: torch.Tensor) -> torch.Tensor:
    out = silu_mul(x) if x.dim() == 2 and not torch.compiler.is_compiling() else None  # traced: torch's ops
    return out if out is not None else type(self).forward(self, x)


@torch.inference_mode()
def same_bits(module, dtype: torch.dtype, h: int = 1536, n_random: int = 100_000) -> bool:
    """The module's forward vs :func:`silu_mul` on every bf16 value as ``gate`` (bf16) or ``3 x n_random`` random
    float32 values (install: 300 k, ~10 ms; the tests: 3 M)."""
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bfloat16:
        gate = torch.arange(-32768, 32768, dtype=torch.int16).view(torch.bfloat16)
    else:
        gate = torch.cat([torch.randn(n_random, generator=g) * s for s in (1.0, 6.0, 40.0)])
    rows = -(-gate.numel() // h)
    gate = torch.cat([gate, gate[: rows * h - gate.numel()]]).view(rows, h)
    x = torch.cat([gate, (torch.randn(rows, h, generator=g) * 2).to(dtype)], dim=1)
    got, want = silu_mul(x), type(module).forward(module, x)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32  # NaN gates: compare the bit patterns
    return got is not None and torch.equal(got.view(bits), want.view(bits))


def install_silu(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Install :func:`silu_forward` on ``model``'s ``SiluAndMul`` modules when the kernel gives their bits;
    returns how many (0: switched off, not buildable or not the same bits: logged)."""
    from octavo.nn.activation import SiluAndMul

    if not env_switch(SWITCH) or dtype not in (torch.bfloat16, torch.float32):
        return 0
    mods = [m for m in model.modules() if type(m) is SiluAndMul]
    if not mods:
        return 0
    if library() is None:
        logger.info("SiLU-and-mul stays in torch ops: %s", _state.get("why"))
        return 0
    if not same_bits(mods[0], dtype):
        logger.warning("SiLU-and-mul kernel not used: it differs from torch's silu on this machine")
        return 0
    for m in mods:
        m.forward = types.MethodType(silu_forward, m)
    return len(mods)
