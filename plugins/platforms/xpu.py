"""The ``xpu`` platform: Intel GPUs (Data Center GPU Max, Arc) through PyTorch's built-in ``torch.xpu``.

Detection asks ``torch.xpu`` (compiled in, device count) without creating a device context; nothing Intel
specific is imported when the plugin loads. Memory comes from ``torch.xpu.mem_get_info``, bf16 from
``torch.xpu.is_bf16_supported()``, collectives from torch.distributed's ``xccl`` backend (PyTorch 2.8+).
No fused backend targets XPU yet, so attention runs on ``torch_sdpa`` and steps run eagerly.

NOTE: untested on real hardware -- no Intel GPU is reachable from this project's CI or device machines. The
code follows the documented ``torch.xpu`` API; tests run it against a test double of that API.
"""

from __future__ import annotations

import os

from octavo.platform import Availability, Platform, PlatformCapabilities


def _xpu():
    import torch

    return torch.xpu


class XpuPlatform(Platform):
    """Intel GPUs (``device="xpu"``), one worker per device."""

    name = "xpu"
    device_type = "xpu"
    distributed_backend = "xccl"
    priority = 100

    @classmethod
    def is_available(cls) -> Availability:
        try:
            import torch
        except ImportError as e:  # pragma: no cover - torch is a hard dependency
            return Availability(False, f"torch is not importable: {e}")
        xpu = getattr(torch, "xpu", None)
        if xpu is None:
            return Availability(False, f"PyTorch {torch.__version__} has no torch.xpu (needs PyTorch 2.4+)")
        compiled = getattr(xpu, "_is_compiled", lambda: True)()
        if not compiled:
            return Availability(False, f"PyTorch {torch.__version__} was built without XPU support; install an "
                                       "XPU build of torch (https://pytorch.org/get-started/locally/)")
        try:
            n = xpu.device_count()
        except Exception as e:
            return Availability(False, f"XPU device query failed: {e}")
        if n <= 0:
            mask = os.environ.get("ZE_AFFINITY_MASK", "<unset>")
            return Availability(False, f"no Intel GPU visible (Level Zero driver missing, or ZE_AFFINITY_MASK={mask})")
        return Availability(True)

    def device_count(self) -> int:
        return int(_xpu().device_count())

    def device_name(self, index: int = 0) -> str:
        return str(_xpu().get_device_name(index))

    def memory_total(self, index: int = 0) -> int:
        return int(_xpu().get_device_properties(index).total_memory)

    def memory_free(self, index: int = 0) -> int:
        free, _total = _xpu().mem_get_info(index)
        return int(free)

    def supported_dtypes(self) -> list[str]:
        dtypes = ["float32", "float16"]
        if _xpu().is_bf16_supported():
            dtypes.insert(1, "bfloat16")
        return dtypes

    def default_dtype(self) -> str:
        return "bfloat16" if "bfloat16" in self.supported_dtypes() else "float16"

    def capabilities(self) -> PlatformCapabilities:
        # graphs: torch.xpu has XPUGraph, but no octavo runner captures it yet -> eager steps.
        return PlatformCapabilities(graphs=False, fp8=False, pinned_memory=True, memory_profiling=True,
                                    extra={"device_count": self.device_count()})

    def synchronize(self) -> None:
        _xpu().synchronize()

    def set_device(self, index: int) -> None:
        _xpu().set_device(index)

    def empty_cache(self) -> None:
        """Return cached, unused allocator blocks to the driver (before measuring free memory)."""
        _xpu().empty_cache()
