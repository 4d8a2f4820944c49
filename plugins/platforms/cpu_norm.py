"""RMSNorm (+ residual add) on a CPU in one C pass per row, the SAME arithmetic as the fused batch-1 stack.

Why: the fused batch-1 decode (:mod:`.cpu_fused_decode`) runs the whole decoder stack in C; for it to be the
default, a request decoding alone must compute the same bits as the same request batched with others (the
int8-activation path's batch invariance) and as a later prefill of the same tokens (prefix-cache invariance).
Torch's ``F.rms_norm`` reduces in an order that depends on its vectorization, which a per-row C loop cannot
copy; so this module replaces the norm of the per-op path (every batch size, prefill too) by :data:`ROW_C`,
the very text the fused stack compiles. Per row (row-independent, so batch invariant): the mean square in
double in index order, ``inv = (float)(1 / sqrt(ms + eps))``, then ``x * inv * w`` in float32 (float32
models) or ``bf16(bf16(x * inv) * w)`` (bfloat16 models: ``RMSNorm._norm``'s rounding points: normalise in
float32, round, scale in bfloat16). With a residual: ``r = x + residual`` rounded to the dtype first.

Installed by the CPU platform's ``prepare_model`` on every ``RMSNorm`` whose weight is float32/bfloat16 (not
with ``OCTAVO_CPU_COMPILE=1``); ``OCTAVO_CPU_C_NORM=0`` keeps torch's. Inputs it does not cover (another dtype,
a weight dtype unlike the input's, non-contiguous rows) run the module's forward. It equals torch's norm to
float32 rounding, not bit for bit (tests/quant/test_cpu_norm.py).
"""

from __future__ import annotations

import ctypes
import types

import torch

from octavo.env_flags import env_switch
from octavo.plugins.quant.cpu_build import cached_library

#: one row; included verbatim by cpu_fused_decode_src (md_bf16: the model dtype is bfloat16)
ROW_C = r"""
static inline float nb_bf2f(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t nb_f2bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* value rounded to the model dtype (bfloat16 when md_bf16) */
static inline float nb_rd(float f, int md_bf16) { return md_bf16 ? nb_bf2f(nb_f2bf(f)) : f; }
/* out = norm(x) * w of one row of n (x already in the model dtype's values) */
static void norm_row(const float* x, const void* w, int md_bf16, long n, double eps, float* out) {
    double ss = 0.0;
    for (long i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)n + eps));
    if (md_bf16) {
        for (long i = 0; i < n; i++) out[i] = nb_rd(nb_rd(x[i] * inv, 1) * nb_bf2f(((const uint16_t*)w)[i]), 1);
    } else {
        for (long i = 0; i < n; i++) out[i] = x[i] * inv * ((const float*)w)[i];
    }
}
"""

C_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
""" + ROW_C + r"""
/* rows of x (and residual: then r = x + residual, written to res_out) -> out; bf16: all tensors bfloat16 */
int rms_rows(const void* x, const void* res, void* res_out, const void* w, long rows, long n, int bf16, double eps,
             void* out, int nthreads) {
    int bad = 0;
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && rows >= 16) reduction(|:bad)
    for (long i = 0; i < rows; i++) {
        float* buf = (float*)malloc(sizeof(float) * (size_t)(2 * n));
        if (!buf) { bad = 1; continue; }
        float *r = buf, *o = buf + n;
        for (long j = 0; j < n; j++) {
            float v = bf16 ? nb_bf2f(((const uint16_t*)x)[i * n + j]) : ((const float*)x)[i * n + j];
            if (res) v = nb_rd(v + (bf16 ? nb_bf2f(((const uint16_t*)res)[i * n + j]) : ((const float*)res)[i * n + j]), bf16);
            r[j] = v;
        }
        norm_row(r, w, bf16, n, eps, o);
        for (long j = 0; j < n; j++) {
            if (bf16) {
                ((uint16_t*)out)[i * n + j] = nb_f2bf(o[j]);
                if (res) ((uint16_t*)res_out)[i * n + j] = nb_f2bf(r[j]);
            } else {
                ((float*)out)[i * n + j] = o[j];
                if (res) ((float*)res_out)[i * n + j] = r[j];
            }
        }
        free(buf);
    }
    return bad;
}
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-strict-aliasing", "-shared", "-fPIC"]
_state: dict[str, object] = {}
SWITCH = "OCTAVO_CPU_C_NORM"


def library() -> ctypes.CDLL | None:
    p, lg, i = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    return cached_library(_state, C_SOURCE, "octavo_cpu_norm", _FLAGS,
                          {"rms_rows": ([p, p, p, p, lg, lg, i, ctypes.c_double, p, i], i)}, switch=SWITCH)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """``normed`` or ``(normed, x + residual)`` like ``RMSNorm.forward``; None when it does not apply."""
    dt = x.dtype
    if (dt not in (torch.float32, torch.bfloat16) or weight.dtype != dt or x.device.type != "cpu"
            or not x.is_contiguous() or not weight.is_contiguous() or x.shape[-1] != weight.shape[0]
            or (residual is not None and (residual.dtype != dt or residual.shape != x.shape
                                          or not residual.is_contiguous()))):
        return None
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=dt)
    res_out = torch.empty(x.shape, dtype=dt) if residual is not None else None
    if library().rms_rows(x.data_ptr(), residual.data_ptr() if residual is not None else None,
                          res_out.data_ptr() if res_out is not None else None, weight.data_ptr(), x.numel() // max(n, 1),
                          n, int(dt == torch.bfloat16), float(eps), out.data_ptr(), torch.get_num_threads()):
        raise MemoryError("RMSNorm: out of memory for a row buffer")
    return out if residual is None else (out, res_out)


def norm_forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
    if torch.compiler.is_compiling():  # a graph traced over this module (ctypes would break it): torch's ops
        return type(self).forward(self, x, residual)
    got = rms_norm(x, self.weight, self.eps, residual)
    return got if got is not None else type(self).forward(self, x, residual)


def installed(module) -> bool:
    """Whether ``module`` (an RMSNorm) runs :func:`norm_forward`."""
    f = module.__dict__.get("forward")
    return getattr(f, "__func__", None) is norm_forward


def install_norm(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Install :func:`norm_forward` on ``model``'s ``RMSNorm`` modules of a float32/bfloat16 weight; returns how
    many (0: switched off or not buildable)."""
    from octavo.nn.layernorm import RMSNorm

    if not env_switch(SWITCH) or dtype not in (torch.bfloat16, torch.float32):
        return 0
    mods = [m for m in model.modules() if type(m) is RMSNorm and m.weight.dtype == dtype]
    if not mods or library() is None:
        return 0
    for m in mods:
        m.forward = types.MethodType(norm_forward, m)
    return len(mods)
