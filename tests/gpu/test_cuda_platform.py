"""The ``cuda`` and ``rocm`` platforms pass ``PlatformContract``; device checks skip where unavailable
(ROCm always here: no AMD GPU is reachable). Plus what the contract does not cover: no CUDA context is
created by listing the platform, and the capability flags follow the compute capability."""

import subprocess
import sys

import pytest

from octavo.plugins.platforms.cuda import CudaPlatform
from octavo.plugins.platforms.rocm import RocmPlatform
from octavo.testing import PlatformContract


class TestCudaPlatform(PlatformContract):
    platform_cls = CudaPlatform


class TestRocmPlatform(PlatformContract):
    platform_cls = RocmPlatform


def test_availability_creates_no_cuda_context():
    code = ("import torch; from octavo.plugins.platforms.cuda import CudaPlatform as P; a = P.is_available(); "
            "P().device_count(); print(torch.cuda.is_initialized(), bool(a))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "False", "is_available()/device_count() initialised CUDA"


def test_capabilities_follow_compute_capability():
    availability = CudaPlatform.is_available()
    if not availability:
        pytest.skip(availability.reason)
    p = CudaPlatform()
    cc = p.compute_capability()
    caps = p.capabilities()
    assert caps.graphs and caps.memory_profiling and caps.pinned_memory
    assert caps.fp8 == (cc >= (8, 9))
    assert p.default_dtype() == ("bfloat16" if cc[0] >= 8 else "float16")
    # backends rank themselves per platform (``platform_priority``): on CUDA the Triton backend leads
    import torch

    from octavo.config import OctavoSettings
    from octavo.registry import get_plugin_manager

    chosen = get_plugin_manager().select_attention_backend(OctavoSettings(), p, dtype=torch.bfloat16, head_size=128)
    assert chosen.name == "triton"
    assert caps.extra["multiprocessor_count"] > 0
