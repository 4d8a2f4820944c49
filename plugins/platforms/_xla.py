"""What the XLA-based platforms share (``tpu`` through ``torch_xla``, ``neuron`` through ``torch_neuronx``,
which runs on torch_xla too): the ``xla`` torch device, the ``xla`` collective backend, memory read from
``torch_xla.core.xla_model.get_memory_info``, and synchronization by ``wait_device_ops``.

Nothing here is imported when the plugin loads; ``torch_xla`` is imported only once a method needs it (after
the platform was selected). NOTE: untested on real hardware (see ``tpu`` and ``neuron``).
"""

from __future__ import annotations

import importlib
import importlib.util

from octavo.platform import Platform, PlatformCapabilities


def has_module(name: str) -> bool:
    """Whether ``name`` is installed, without importing it (``find_spec`` of a dotted name imports its parent,
    so only top-level names are asked)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def xla_model():
    """``torch_xla.core.xla_model`` (imported on first use)."""
    return importlib.import_module("torch_xla.core.xla_model")


class XlaPlatform(Platform):
    """Base of the platforms whose tensors live on torch's ``xla`` device."""

    device_type = "xla"
    distributed_backend = "xla"

    def device(self):
        """The process's XLA device (``xla:0``)."""
        return xla_model().xla_device()

    def _memory(self) -> tuple[int, int]:
        """``(total, free)`` bytes of this process's device; torch_xla reports either bytes or KiB."""
        info = xla_model().get_memory_info(self.device())
        if "bytes_limit" in info:
            total, used = int(info["bytes_limit"]), int(info.get("bytes_used", 0))
            return total, max(0, total - used)
        return int(info["kb_total"]) * 1024, int(info["kb_free"]) * 1024

    def memory_total(self, index: int = 0) -> int:
        return self._memory()[0]

    def memory_free(self, index: int = 0) -> int:
        return self._memory()[1]

    def supported_dtypes(self) -> list[str]:
        return ["float32", "bfloat16"]

    def default_dtype(self) -> str:
        return "bfloat16"

    def capabilities(self) -> PlatformCapabilities:
        # XLA compiles whole graphs itself; octavo's step-graph runner is CUDA-only, so graphs=False here.
        return PlatformCapabilities(graphs=False, fp8=False, pinned_memory=False, memory_profiling=True)

    def synchronize(self) -> None:
        xla_model().wait_device_ops()

    def set_device(self, index: int) -> None:
        """No-op: the XLA runtime gives each process its own device (PJRT, one process per device)."""
