"""Triton dequant-GEMM for 8-bit group-quantized weights on GPU (GPTQ 8-bit, compressed-tensors W8A16).

``y = x @ (q * s + z)`` with ``q`` int8 ``[K, N]`` read once per tile and dequantized in registers, a scale and a
zero per group of input rows (the group a multiple of the 32-row K tile, so each tile has one group), fp32
accumulation. Imported only when a layer runs on CUDA (or under ``TRITON_INTERPRET=1`` in the CPU test).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_K = 32


@triton.jit
def _int8_group_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, M, N, K, GROUP,
                       sxm, sxk, swk, swn, ssg, ssn, sym, syn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       LOW_PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm[:, None] < M
    n_ok = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * sxm + kk[None, :] * sxk, mask=m_ok, other=0.0)
        w = tl.load(w_ptr + kk[:, None] * swk + rn[None, :] * swn, mask=n_ok[None, :], other=0).to(tl.float32)
        g = k0 // GROUP
        s = tl.load(s_ptr + g * ssg + rn * ssn, mask=n_ok, other=0.0)
        z = tl.load(z_ptr + g * ssg + rn * ssn, mask=n_ok, other=0.0)
        wf = w * s[None, :] + z[None, :]
        if LOW_PRECISION:
            acc = tl.dot(x.to(tl.bfloat16), wf.to(tl.bfloat16), acc)
        else:
            acc += tl.dot(x.to(tl.float32), wf, input_precision="ieee")
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :] * syn, acc, mask=m_ok & n_ok[None, :])


def int8_group_matmul(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """``x [M, K]`` times the weight ``q * s + z`` (``w`` int8 ``[K, N]``, ``scales``/``zeros`` ``[G, N]``) ->
    float32 ``[M, N]``. bf16 tensor-core products for bf16/fp16 ``x``, IEEE fp32 for fp32 ``x``."""
    m, k = x.shape
    n = w.shape[1]
    group = k // scales.shape[0]
    if k % BLOCK_K or group % BLOCK_K:
        raise ValueError(f"int8 group kernel: K={k} and the group {group} must be multiples of {BLOCK_K}")
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    block_m = 16 if m <= 16 else 64
    block_n = 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _int8_group_kernel[grid](x, w, scales, zeros, y, m, n, k, group,
                             x.stride(0), x.stride(1), w.stride(0), w.stride(1), scales.stride(0), scales.stride(1),
                             y.stride(0), y.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK_K,
                             LOW_PRECISION=x.dtype in (torch.bfloat16, torch.float16))
    return y
