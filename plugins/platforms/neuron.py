"""The ``neuron`` platform: AWS Inferentia2 / Trainium through ``torch_neuronx`` (which runs on torch_xla).

Detection without importing the vendor stack at plugin load: ``is_available`` asks
``importlib.util.find_spec("torch_neuronx")`` and counts the Neuron devices the driver exposes
(``/dev/neuron*``), importing nothing. The rest is XLA (:class:`~octavo.plugins.platforms._xla.XlaPlatform`):
tensors on ``xla``, collectives on the ``xla`` backend, memory from ``xla_model.get_memory_info``, bf16.

NOTE: untested on real hardware -- no Inferentia/Trainium is reachable from this project's CI or device
machines. The code follows the documented torch_neuronx / torch_xla APIs; tests run it against a test double.
Neuron compiles per input shape ahead of time, so a real deployment would need bucketed step shapes, which
the engine does not do yet.
"""

from __future__ import annotations

import glob
import os

from octavo.platform import Availability
from octavo.plugins.platforms._xla import XlaPlatform, has_module

#: where the Neuron driver exposes its devices (overridable for tests and containers).
DEVICE_GLOB = os.environ.get("OCTAVO_NEURON_DEVICE_GLOB", "/dev/neuron[0-9]*")


def _devices() -> list[str]:
    return sorted(glob.glob(DEVICE_GLOB))


class NeuronPlatform(XlaPlatform):
    """AWS Inferentia2 / Trainium (``device="neuron"``)."""

    name = "neuron"
    priority = 100

    @classmethod
    def is_available(cls) -> Availability:
        if not has_module("torch_neuronx"):
            return Availability(False, "torch_neuronx is not installed (pip install torch-neuronx from the AWS "
                                       "Neuron repository)")
        if not _devices():
            return Availability(False, f"no Neuron device found ({DEVICE_GLOB} matches nothing: not an Inf2/Trn1 "
                                       "instance, or the aws-neuronx driver is not loaded)")
        return Availability(True)

    def device_count(self) -> int:
        return len(_devices())

    def device_name(self, index: int = 0) -> str:
        return f"AWS Neuron device {os.path.basename(_devices()[index])}"
