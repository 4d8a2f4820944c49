"""Zero-filled host tensors whose pages the kernel provides on first touch (``calloc``), for the KV cache.

``torch.zeros`` on the CPU allocates and then writes every byte: the default 1 GiB KV cache of ``octavo serve`` on
a CPU costs 0.3-2 s of its start (docs/performance.md, "Start-up"), although a short session touches only a few
blocks. ``numpy.zeros`` allocates with ``calloc``, which for large sizes maps fresh pages that the kernel
guarantees to be zero, so nothing is written up front; the tensor views that memory (aligned to 64 bytes) and
keeps it alive. Same values, same dtype and shape; other devices keep ``torch.zeros``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

_ALIGN = 64


def zeros(shape, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)``; on the CPU backed by ``calloc``'d memory."""
    device = torch.device(device)
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes < 1 << 20:  # small: nothing to save
        return torch.zeros(shape, dtype=dtype, device=device)
    raw = np.zeros(nbytes + _ALIGN, dtype=np.uint8)
    offset = (-raw.ctypes.data) % _ALIGN
    return torch.from_numpy(raw[offset:offset + nbytes]).view(dtype).view(shape)
