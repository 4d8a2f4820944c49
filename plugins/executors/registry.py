"""Every built-in executor, registered by lazy ``"module:Class"`` targets (entry point ``executors``).

Imports nothing heavy: ``ray`` is imported only when the ``ray`` executor is built (a missing Ray is an
error then, naming the extra to install).
"""

from octavo import hookimpl

_PKG = "octavo.plugins.executors"

EXECUTORS = {
    "uni": f"{_PKG}.uni:UniExecutor",
    "mp": f"{_PKG}.mp:MultiprocExecutor",
    "ray": f"{_PKG}.ray_executor:RayExecutor",
}


@hookimpl(trylast=True)
def octavo_register_executors(register):
    for name, target in EXECUTORS.items():
        register(name, target)
