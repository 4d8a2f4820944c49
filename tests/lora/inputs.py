"""Input builders shared by the LoRA op tests (test_lora_ops, test_lora_static, test_lora_gpu) and the Triton
scripts they run under ``TRITON_INTERPRET=1``: one place for the layouts the manager stores."""

from __future__ import annotations

import torch


def lora_data(n, k, o, r, slots=6, seed=0, dtype=torch.float32, parts=None):
    """``x [n, k]``, ``y [n, o]``, ``A [slots, r, k]`` and per-slot ``B [slots, o, r]`` (the CPU layout).

    ``parts``: a fused projection's output offsets; B is then block-diagonal as the manager writes it (part ``p``'s
    rows use only rank columns ``[p * r/len(parts), (p + 1) * r/len(parts))``)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=gen).to(dtype)
    y = torch.randn(n, o, generator=gen).to(dtype)
    a = (torch.randn(slots, r, k, generator=gen) * 0.1).to(dtype)
    b = (torch.randn(slots, o, r, generator=gen) * 0.1).to(dtype)
    if parts is not None:
        b = b * block_diagonal(parts, o, r).to(dtype)
    return x, y, a, b


def flat_weights(slots, k, o, r, dtype=torch.float32, seed=0, parts=None):
    """``A [slots, r, k]`` and B as the manager stores it on CUDA: ``b_flat [o, slots*r]`` with ``lora_b`` its
    ``[slots, o, r]`` view; returns ``(a, lora_b, b_flat)``. ``parts``: block-diagonal B (see :func:`lora_data`)."""
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(slots, r, k, generator=gen) * 0.1).to(dtype)
    b_flat = (torch.randn(o, slots * r, generator=gen) * 0.1).to(dtype)
    if parts is not None:
        b_flat = b_flat * block_diagonal(parts, o, r).repeat(1, slots).to(dtype)
    return a, b_flat.view(o, slots, r).permute(1, 0, 2), b_flat


def block_diagonal(parts, o, r):
    """``[o, r]`` 0/1 mask: rows of part ``p`` (offsets ``parts``) keep rank columns of block ``p`` only."""
    mask = torch.zeros(o, r)
    bounds = [*parts, o]
    rp = r // len(parts)
    for p in range(len(parts)):
        mask[bounds[p]:bounds[p + 1], p * rp:(p + 1) * rp] = 1
    return mask
