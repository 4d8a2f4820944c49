"""Inputs shared by the int8-activation kernel tests (test_cpu_int8act.py, test_cpu_int8act_batch_invariance.py).

Why one module: both test files built the same weights and the same list of build targets with their own copies.
"""

from __future__ import annotations

import platform

import torch

from octavo.plugins.quant import cpu_int8act, cpu_kernel


def _buildable(isa: str) -> bool:
    try:
        cpu_int8act.library(isa)
        return True
    except (OSError, RuntimeError, ValueError):
        return False


#: build targets that compile and run here: ``native`` anywhere, plus ``avx2`` / ``generic`` on x86-64
ISAS = [i for i in cpu_int8act.ISAS if (i == "native" or platform.machine() in ("x86_64", "AMD64")) and _buildable(i)]
#: reason to skip a module when nothing can be built
UNAVAILABLE = not ISAS or cpu_kernel.library() is None


def weights(n: int, k: int, gen: torch.Generator):
    """``n x k`` int4 codes (uint8 0..15, unpacked), int8 codes (-128..127), group-of-32 scales and zeros."""
    q4 = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    q8 = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    s, z = torch.rand(n, k // 32, generator=gen) * 0.02, torch.randn(n, k // 32, generator=gen) * 0.02
    return q4, q8, s, z


def packed_weights(n: int, k: int, seed: int):
    """:func:`weights` with the int4 codes packed as the kernels read them."""
    q4, q8, s, z = weights(n, k, torch.Generator().manual_seed(seed))
    return cpu_kernel.pack_int4(q4), q8, s, z


def block_rows(m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """``m x k`` activations whose 32-element blocks have different ranges; the first block all zero (d = 0)."""
    x = torch.randn(m, k, generator=gen) * torch.rand(m, k // 32, 1, generator=gen).repeat(1, 1, 32).reshape(m, k)
    if k > 32:
        x[:, :32] = 0
    return x


def scaled_rows(m: int, k: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """``m x k`` activations, each row with its own range (so rows quantize with different scales)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4).to(dtype)


def case(m: int, k: int, n: int, seed: int):
    """``(x, q4, q8, s, z)``: :func:`block_rows` and :func:`weights` from one seed."""
    gen = torch.Generator().manual_seed(seed)
    return (block_rows(m, k, gen), *weights(n, k, gen))
