"""The ``hpu`` platform: Intel Gaudi accelerators through ``habana_frameworks.torch`` (the Gaudi PyTorch bridge).

Detection without importing the vendor stack at plugin load: ``is_available`` asks
``importlib.util.find_spec("habana_frameworks")`` first and imports ``habana_frameworks.torch.hpu`` only then.
Tensors live on the ``hpu`` device; collectives use ``hccl`` (registered by
``habana_frameworks.torch.distributed.hccl``, imported in :meth:`HpuPlatform.set_device`); bf16 is the
default dtype; memory comes from the bridge's ``memory_stats()`` (``Limit`` / ``InUse``); fp8 is reported
from Gaudi2 on.

NOTE: untested on real hardware -- no Gaudi is reachable from this project's CI or device machines. The code
follows the Gaudi bridge's documented ``habana_frameworks.torch.hpu`` API; tests run it against a test double
of that API. Steps run eagerly (lazy-mode graphs are the bridge's default and need no octavo runner).
"""

from __future__ import annotations

import importlib

from octavo.platform import Availability, Platform, PlatformCapabilities
from octavo.plugins.platforms._xla import has_module


def _hpu():
    return importlib.import_module("habana_frameworks.torch.hpu")


class HpuPlatform(Platform):
    """Intel Gaudi (``device="hpu"``), one worker per card."""

    name = "hpu"
    device_type = "hpu"
    distributed_backend = "hccl"
    priority = 100

    @classmethod
    def is_available(cls) -> Availability:
        if not has_module("habana_frameworks"):
            return Availability(False, "habana_frameworks is not installed (the Gaudi PyTorch bridge, from "
                                       "Intel's Gaudi software stack)")
        try:
            hpu = _hpu()
            ok, n = bool(hpu.is_available()), int(hpu.device_count())
        except Exception as e:
            return Availability(False, f"Gaudi device query failed: {type(e).__name__}: {e}")
        if not ok or n <= 0:
            return Availability(False, "no Gaudi device visible (habana driver missing, or HABANA_VISIBLE_DEVICES "
                                       "hides them)")
        return Availability(True)

    def device_count(self) -> int:
        return int(_hpu().device_count())

    def device_name(self, index: int = 0) -> str:
        return str(_hpu().get_device_name(index))

    def _stats(self, index: int) -> dict:
        return _hpu().memory_stats(index)

    def memory_total(self, index: int = 0) -> int:
        return int(self._stats(index)["Limit"])

    def memory_free(self, index: int = 0) -> int:
        stats = self._stats(index)
        return max(0, int(stats["Limit"]) - int(stats["InUse"]))

    def supported_dtypes(self) -> list[str]:
        return ["float32", "bfloat16", "float16"]

    def default_dtype(self) -> str:
        return "bfloat16"

    def capabilities(self) -> PlatformCapabilities:
        name = self.device_name().upper()
        fp8 = any(gen in name for gen in ("GAUDI2", "GAUDI3"))
        return PlatformCapabilities(graphs=False, fp8=fp8, pinned_memory=False, memory_profiling=True,
                                    extra={"device_name": name})

    def synchronize(self) -> None:
        _hpu().synchronize()

    def set_device(self, index: int) -> None:
        # registers the "hccl" torch.distributed backend with the process
        if has_module("habana_frameworks"):
            importlib.import_module("habana_frameworks.torch.distributed.hccl")
        _hpu().set_device(index)
