"""The plugin author's kit: contract test suites a plugin package subclasses in its own pytest run.

    # tests/test_my_platform.py of package octavo-myplatform
    from octavo.testing import PlatformContract
    from octavo_myplatform import MyPlatform

    class TestMyPlatform(PlatformContract):
        platform_cls = MyPlatform

Built-in plugins pass the same suites. Names load lazily, so ``import octavo.testing`` is cheap and a
suite whose module has not landed yet fails only when it is used.
"""

from __future__ import annotations

import importlib

# contract class -> module defining it (each module is owned by the engineer of that plugin kind)
_LAZY = {
    "PlatformContract": "octavo.testing.platform",
    "AttentionBackendContract": "octavo.testing.attention",
    "ModelContract": "octavo.testing.model",
    "QuantizerContract": "octavo.testing.quant",
    "SpeculatorContract": "octavo.testing.speculator",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'octavo.testing' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise AttributeError(f"octavo.testing.{name} is not available in this octavo version ({module} is "
                             "missing)") from e
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
