"""The ``rocm`` platform: AMD GPUs through PyTorch's ROCm (HIP) build.

ROCm PyTorch exposes AMD GPUs as ``torch.cuda`` devices, so everything but discovery and preferences comes
from :class:`~octavo.plugins.platforms.cuda.TorchGpuPlatform`. NOTE: untested — no AMD GPU is reachable
from this project's CI or device machines; the code follows PyTorch's documented HIP semantics only.
"""

from __future__ import annotations

import os

from octavo.platform import Availability
from octavo.plugins.platforms.cuda import TorchGpuPlatform


class RocmPlatform(TorchGpuPlatform):
    """AMD Instinct / Radeon GPUs (``device="rocm"``; tensors live on torch's ``cuda`` device type).

    Collectives use RCCL, which torch.distributed names ``nccl``. fp8 is reported from gfx94x (MI300) on;
    bf16 on every CDNA/RDNA3 part torch supports. Untested here (no AMD hardware available).
    """

    name = "rocm"

    @classmethod
    def is_available(cls) -> Availability:
        try:
            import torch
        except ImportError as e:  # pragma: no cover
            return Availability(False, f"torch is not importable: {e}")
        if torch.version.hip is None:
            return Availability(False, f"PyTorch {torch.__version__} is not a ROCm build (torch.version.hip is "
                                       "None); install torch from the ROCm index")
        try:
            n = cls._count_without_context()
        except Exception as e:
            return Availability(False, f"ROCm device query failed: {e}")
        if n <= 0:
            env = os.environ.get("HIP_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
            return Availability(False, f"no AMD GPU visible (amdgpu driver missing, or HIP_VISIBLE_DEVICES={env})")
        return Availability(True)

    def gcn_arch(self, index: int = 0) -> str:
        """The gfx target, e.g. ``"gfx942"`` for MI300X."""
        import torch

        return str(getattr(torch.cuda.get_device_properties(index), "gcnArchName", "")).split(":")[0]

    def supports_bf16(self, index: int = 0) -> bool:
        return True

    def supports_fp8(self, index: int = 0) -> bool:
        return self.gcn_arch(index).startswith(("gfx94", "gfx95", "gfx12"))
