"""Every built-in executor, registered by lazy ``"module:Class"`` targets (entry point ``executors``).

Imports nothing heavy.
"""

from octavo import hookimpl

_PKG = "octavo.plugins.executors"

EXECUTORS = {
    "uni": f"{_PKG}.uni:UniExecutor",
    "mp": f"{_PKG}.mp:MultiprocExecutor",
}


@hookimpl(trylast=True)
def octavo_register_executors(register):
    for name, target in EXECUTORS.items():
        register(name, target)
