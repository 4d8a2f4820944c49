"""The ``tpu`` platform: Google Cloud TPUs through ``torch_xla`` (PJRT runtime).

Detection without importing the vendor stack at plugin load: ``is_available`` first asks
``importlib.util.find_spec("torch_xla")`` and only then imports ``torch_xla.runtime`` to read the device
kind and count. Tensors live on the ``xla`` device, collectives use torch_xla's ``xla`` backend, bf16 is the
native dtype (no fp16 arithmetic on TPU), memory comes from ``xla_model.get_memory_info``.

NOTE: untested on real hardware -- no TPU is reachable from this project's CI or device machines. The code
follows torch_xla's documented public API; tests run it against a test double of that API. XLA recompiles
for every new input shape, so a real deployment would also need padded (bucketed) step shapes, which the
engine does not do yet; expect slow first steps.
"""

from __future__ import annotations

import importlib

from octavo.platform import Availability
from octavo.plugins.platforms._xla import XlaPlatform, has_module


def _runtime():
    return importlib.import_module("torch_xla.runtime")


class TpuPlatform(XlaPlatform):
    """Google TPUs (``device="tpu"``): one process per TPU chip, tensors on ``xla``."""

    name = "tpu"
    priority = 100

    @classmethod
    def is_available(cls) -> Availability:
        if not has_module("torch_xla"):
            return Availability(False, "torch_xla is not installed (pip install 'torch_xla[tpu]' matching your "
                                       "torch version)")
        try:
            runtime = _runtime()
            kind = runtime.device_type()
            n = runtime.addressable_device_count()
        except Exception as e:
            return Availability(False, f"torch_xla runtime query failed: {type(e).__name__}: {e}")
        if kind != "TPU":
            return Availability(False, f"torch_xla's device type is {kind!r}, not 'TPU' (set PJRT_DEVICE=TPU on a "
                                       "TPU VM)")
        if n <= 0:
            return Availability(False, "torch_xla sees no TPU device")
        return Availability(True)

    def device_count(self) -> int:
        return int(_runtime().addressable_device_count())

    def device_name(self, index: int = 0) -> str:
        hw = self.device()
        kind = getattr(_runtime(), "device_type", lambda: "TPU")()
        return f"{kind} ({hw})"
