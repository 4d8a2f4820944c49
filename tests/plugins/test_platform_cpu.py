"""The built-in CPU platform passes the same PlatformContract a third-party platform must pass, and reports
what this machine really has."""

import os

import psutil

from octavo.plugins.platforms.cpu import CpuPlatform, cpu_flags
from octavo.testing import PlatformContract


class TestCpuPlatform(PlatformContract):
    platform_cls = CpuPlatform


def test_reports_this_machine():
    p = CpuPlatform()
    assert p.num_cores() == len(os.sched_getaffinity(0))
    assert 1 <= p.num_physical_cores() <= p.num_cores()
    assert p.memory_total() <= psutil.virtual_memory().total
    assert p.distributed_backend == "gloo"
    assert p.preferred_attention_backends() == []  # backends declare the platforms they suit


def test_dtypes_follow_cpu_flags():
    flags = cpu_flags()
    dtypes = CpuPlatform().supported_dtypes()
    assert dtypes[0] == "float32"
    assert ("bfloat16" in dtypes) == bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    assert ("float16" in dtypes) == bool(flags & {"avx512_fp16", "amx_fp16", "asimdhp"})


def test_default_dtype_is_bf16_only_where_native():
    native = bool(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})
    assert CpuPlatform().default_dtype() == ("bfloat16" if native else "float32")
    assert CpuPlatform().default_dtype() in CpuPlatform().supported_dtypes()
