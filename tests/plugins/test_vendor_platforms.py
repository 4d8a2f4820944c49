"""The xpu, tpu, hpu and neuron platforms pass PlatformContract with their vendor module simulated by a test
double of its public API (no such hardware is reachable here), and are honest about why they are
unavailable without it. Loading the platform registry imports no vendor stack.

Each double implements only the documented public calls the platform uses (``torch.xpu.*``,
``torch_xla.runtime`` / ``torch_xla.core.xla_model``, ``habana_frameworks.torch.hpu``, ``torch_neuronx``),
with a device of 32 GiB total and 30 GiB free. Compute checks are off (``check_compute = False``): a double
cannot run a matmul, and the skip says so.
"""

import importlib.machinery
import json
import subprocess
import sys
import types

import pytest
import torch

from octavo.plugins.platforms.hpu import HpuPlatform
from octavo.plugins.platforms.neuron import NeuronPlatform
from octavo.plugins.platforms.tpu import TpuPlatform
from octavo.plugins.platforms.xpu import XpuPlatform
from octavo.registry import availability, resolve
from octavo.testing import PlatformContract

GiB = 1 << 30


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)  # so find_spec() sees it installed
    module.__dict__.update(attrs)
    return module


def _install(monkeypatch, *modules: types.ModuleType) -> None:
    for m in modules:
        monkeypatch.setitem(sys.modules, m.__name__, m)


@pytest.fixture
def fake_xpu(monkeypatch):
    calls = []
    props = types.SimpleNamespace(total_memory=32 * GiB, name="Intel(R) Data Center GPU Max 1550")
    xpu = _module(
        "torch.xpu", _is_compiled=lambda: True, device_count=lambda: 2, get_device_name=lambda i=0: props.name,
        get_device_properties=lambda i=0: props, mem_get_info=lambda i=0: (30 * GiB, 32 * GiB),
        is_bf16_supported=lambda: True, synchronize=lambda: calls.append("sync"),
        set_device=lambda i: calls.append(("set_device", i)), empty_cache=lambda: None)
    monkeypatch.setattr(torch, "xpu", xpu)
    return calls


@pytest.fixture
def fake_xla(monkeypatch):
    calls = []
    runtime = _module("torch_xla.runtime", device_type=lambda: "TPU", addressable_device_count=lambda: 4)
    xm = _module("torch_xla.core.xla_model", xla_device=lambda: "xla:0",
                 get_memory_info=lambda dev: {"bytes_limit": 32 * GiB, "bytes_used": 2 * GiB},
                 wait_device_ops=lambda: calls.append("sync"))
    core = _module("torch_xla.core", xla_model=xm)
    _install(monkeypatch, _module("torch_xla", runtime=runtime, core=core), runtime, core, xm)
    return calls


@pytest.fixture
def fake_hpu(monkeypatch):
    calls = []
    hpu = _module("habana_frameworks.torch.hpu", is_available=lambda: True, device_count=lambda: 8,
                  get_device_name=lambda i=0: "GAUDI2", memory_stats=lambda i=0: {"Limit": 32 * GiB, "InUse": 2 * GiB},
                  synchronize=lambda: calls.append("sync"), set_device=lambda i: calls.append(("set_device", i)))
    hccl = _module("habana_frameworks.torch.distributed.hccl")
    dist = _module("habana_frameworks.torch.distributed", hccl=hccl)
    ht = _module("habana_frameworks.torch", hpu=hpu, distributed=dist)
    _install(monkeypatch, _module("habana_frameworks", torch=ht), ht, hpu, dist, hccl)
    return calls


@pytest.fixture
def fake_neuron(monkeypatch, tmp_path, fake_xla):
    for i in range(2):
        (tmp_path / f"neuron{i}").touch()
    monkeypatch.setattr("octavo.plugins.platforms.neuron.DEVICE_GLOB", str(tmp_path / "neuron[0-9]*"))
    _install(monkeypatch, _module("torch_neuronx"))
    return fake_xla


class _Simulated(PlatformContract):
    check_compute = False  # the vendor module is a test double: no real tensors on its device
    fixture_name: str

    @pytest.fixture(autouse=True)
    def _vendor(self, request):
        request.getfixturevalue(self.fixture_name)


class TestXpuPlatform(_Simulated):
    platform_cls, fixture_name = XpuPlatform, "fake_xpu"


class TestTpuPlatform(_Simulated):
    platform_cls, fixture_name = TpuPlatform, "fake_xla"


class TestHpuPlatform(_Simulated):
    platform_cls, fixture_name = HpuPlatform, "fake_hpu"


class TestNeuronPlatform(_Simulated):
    platform_cls, fixture_name = NeuronPlatform, "fake_neuron"


def test_simulated_devices_report_what_the_vendor_api_says(fake_xpu, fake_hpu, fake_neuron):
    xpu, hpu, neuron = XpuPlatform(), HpuPlatform(), NeuronPlatform()
    assert (xpu.device_count(), xpu.memory_free(1), xpu.default_dtype()) == (2, 30 * GiB, "bfloat16")
    xpu.set_device(1)
    assert ("set_device", 1) in fake_xpu
    assert (hpu.memory_total(), hpu.memory_free(), hpu.capabilities().fp8) == (32 * GiB, 30 * GiB, True)
    assert hpu.distributed_backend == "hccl" and neuron.distributed_backend == "xla"
    assert (neuron.device_count(), neuron.memory_free(), neuron.device_type) == (2, 30 * GiB, "xla")
    assert TpuPlatform().supported_dtypes() == ["float32", "bfloat16"]  # no fp16 arithmetic on TPU


def test_registered_and_honest_about_why_unavailable_here():
    for name in ("xpu", "tpu", "hpu", "neuron"):
        assert resolve("platforms", name).name == name
        ok, reason = availability("platforms", name)
        assert not ok and reason, f"{name} should be unavailable on this machine, with a reason"
    assert "built without XPU" in availability("platforms", "xpu")[1]
    assert "torch_xla is not installed" in availability("platforms", "tpu")[1]
    assert "habana_frameworks is not installed" in availability("platforms", "hpu")[1]
    assert "torch_neuronx is not installed" in availability("platforms", "neuron")[1]


def test_loading_and_listing_imports_no_vendor_stack():
    code = ("import sys, json; from octavo.registry import get_plugin_manager; pm = get_plugin_manager(); "
            "[pm.availability('platforms', n) for n in ('xpu', 'tpu', 'hpu', 'neuron')]; "
            "print(json.dumps([m for m in ('torch_xla', 'habana_frameworks', 'torch_neuronx') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
