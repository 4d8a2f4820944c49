"""One host-to-device copy per step: a step's small input arrays packed into a pinned buffer, copied at once.

Why: at batch 1 a Qwen3-30B-A3B decode step made 12 small host-to-device copies from pageable memory (step inputs,
the graph runner's layout rows, the sampler's columns), 16 memcpys with the copies on the device. Session 11's
H100 trace put ~25 us a step of GPU idle between the last pageable copy and the forward graph's first kernel, and
~134-176 us of host time in ``cudaMemcpyAsync`` (a pageable copy is staged by the driver inside the call). A copy
from pinned memory is a plain DMA the driver only enqueues. :meth:`PinnedStaging.stage` writes the arrays into the
next slot of a ring of pinned host buffers, issues one copy into that slot's device twin and returns device views
with the arrays' dtypes and shapes: the same values as ``torch.from_numpy(a).to(device, non_blocking=True)``.

Reuse rules: a slot's host buffer is written again only after the copy that read it has finished (its event;
with ``SLOTS`` steps between reuses the wait is normally already over). Its device buffer is overwritten by a copy
that is stream-ordered after every kernel enqueued before it on the same stream, so a view stays valid for the
work of its own step and the next ``SLOTS - 1`` steps' enqueues. Callers use the views within their step.
"""

from __future__ import annotations

import numpy as np
import torch

SLOTS = 8
_ALIGN = 16  # every array starts 16-byte aligned in the slot, so an int64 / float32 view of the bytes is legal
_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(np.float32): torch.float32,
           np.dtype(np.bool_): torch.bool}


class _Slot:
    __slots__ = ("host", "host_np", "dev", "event")

    def __init__(self) -> None:
        self.host: torch.Tensor | None = None
        self.host_np: np.ndarray | None = None
        self.dev: torch.Tensor | None = None
        self.event: torch.Event | None = None


class PinnedStaging:
    """A ring of ``SLOTS`` pinned host buffers with device twins on one accelerator device (see the module docstring;
    measured on CUDA only)."""

    def __init__(self, device: torch.device, slots: int = SLOTS) -> None:
        if device.type == "cpu":  # (pinned host memory and a device twin mean nothing on the host itself)
            raise ValueError(f"PinnedStaging needs an accelerator device, not {device}")
        self.device = device
        self.slots = [_Slot() for _ in range(slots)]
        self.next = 0
        self.copies = 0  # host-to-device copies issued (one per stage() call)

    def stage(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """Device tensors equal to ``arrays`` (C-contiguous numpy arrays of int64 / int32 / float32 / bool), from one
        host-to-device copy, enqueued on the current stream."""
        offs, total = [], 0
        for a in arrays:
            if a.dtype not in _DTYPES or not a.flags.c_contiguous:
                raise ValueError(f"PinnedStaging.stage: {a.dtype} array (contiguous: {a.flags.c_contiguous}); "
                                 f"takes C-contiguous {', '.join(str(d) for d in _DTYPES)}")
            offs.append(total)
            total += -(-a.nbytes // _ALIGN) * _ALIGN
        slot = self.slots[self.next]
        self.next = (self.next + 1) % len(self.slots)
        if slot.event is not None:
            slot.event.synchronize()  # the copy that last read this host buffer has finished
        if slot.host is None or slot.host.numel() < total:
            cap = 1 << max(12, (total - 1).bit_length())
            slot.host = torch.empty(cap, dtype=torch.uint8, pin_memory=True)
            slot.host_np = slot.host.numpy()
            slot.dev = torch.empty(cap, dtype=torch.uint8, device=self.device)
        host = slot.host_np
        for a, o in zip(arrays, offs):
            host[o:o + a.nbytes] = a.reshape(-1).view(np.uint8)
        if total:
            slot.dev[:total].copy_(slot.host[:total], non_blocking=True)
            if slot.event is None:
                slot.event = torch.Event(device=self.device.type)
            slot.event.record()
            self.copies += 1
        return [slot.dev[o:o + a.nbytes].view(_DTYPES[a.dtype]).view(a.shape) for a, o in zip(arrays, offs)]
