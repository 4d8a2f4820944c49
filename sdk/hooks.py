"""The pluggy markers of project ``octavo`` and the types hook implementations receive.

Plugin authors decorate their hook functions with ``hookimpl``; a register hook receives a :class:`Register`.
"""

from __future__ import annotations

from typing import Protocol

import pluggy

PROJECT_NAME = "octavo"
ENTRY_POINT_GROUP = "octavo"

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
hookspec = pluggy.HookspecMarker(PROJECT_NAME)


class Register(Protocol):
    """What an ``octavo_register_<kind>`` hook receives: call it once per name.

    ``register("mychip", "octavo_mychip.platform:MyChipPlatform")`` records a lazy target, imported only when
    the name is resolved; a class is accepted too (stored as its ``"module:QualName"`` path). The plugin
    manager records which plugin and distribution made each call, so conflicts and shadowing name them.
    """

    def __call__(self, name: str, target: str | type) -> None: ...
