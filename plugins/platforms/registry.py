"""Every built-in platform, registered by lazy ``"module:Class"`` targets (entry point ``platforms``).

Registry name == module name. Importing this module imports nothing (no torch, no vendor stack); a
platform's module is imported when the platform is resolved, and its vendor stack only when it is asked
whether it is available. Each platform ranks itself (``Platform.priority``): accelerators 100, ``cpu`` -100.
``xpu``, ``tpu``, ``hpu``, ``neuron`` and ``rocm`` are untested on real hardware (see their docstrings).
"""

from octavo import hookimpl

PLATFORMS = {
    "cpu": "octavo.plugins.platforms.cpu:CpuPlatform",
    "cuda": "octavo.plugins.platforms.cuda:CudaPlatform",
    "rocm": "octavo.plugins.platforms.rocm:RocmPlatform",
    "xpu": "octavo.plugins.platforms.xpu:XpuPlatform",
    "tpu": "octavo.plugins.platforms.tpu:TpuPlatform",
    "hpu": "octavo.plugins.platforms.hpu:HpuPlatform",
    "neuron": "octavo.plugins.platforms.neuron:NeuronPlatform",
}


@hookimpl(trylast=True)
def octavo_register_platforms(register):
    for name, target in PLATFORMS.items():
        register(name, target)
