"""The registries: who registered which name of which kind, the shadowing rule, and name -> class resolution.

Kinds come from the hookspecs (:func:`octavo.core.hookspecs.registry_kinds`): every
``octavo_register_<kind>(register)`` spec is one registry, so a new kind needs no edit here. Each plugin's
register hook is called on its own with a :class:`RegisterCall` that records the plugin and distribution::

    registrations of one name ──> third-party ones, if any, else the built-in ones
        one distinct target  -> the winner; every other registration is marked shadowed_by the winner
        several targets      -> PluginConflictError naming both distributions

Targets stay lazy ``"module:Class"`` strings until :meth:`Registry.resolve`; nothing here imports torch.
"""

from __future__ import annotations

import difflib
import importlib
import re
from dataclasses import dataclass, field
from typing import Any

import pluggy

from octavo.core.hookspecs import registry_kinds
from octavo.errors import PluginConflictError, PluginError, UnknownPluginError

BUILTIN_DISTRIBUTION = "octavo"


def norm(name: str) -> str:
    """A distribution or plugin name in its normalized form (PEP 503: ``Foo_Bar`` == ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Registration:
    """One ``register(name, target)`` call: who registered what, and who shadows it."""

    kind: str
    name: str
    target: str
    plugin: str
    distribution: str
    shadowed_by: str | None = None

    @property
    def builtin(self) -> bool:
        return norm(self.distribution) == BUILTIN_DISTRIBUTION


@dataclass
class PluginInfo:
    """What ``octavo plugins`` reports about one plugin."""

    name: str
    distribution: str
    version: str
    module: str
    hooks: list[str] = field(default_factory=list)
    registrations: list[Registration] = field(default_factory=list)
    error: str | None = None

    @property
    def builtin(self) -> bool:
        return norm(self.distribution) == BUILTIN_DISTRIBUTION


class RegisterCall:
    """The ``register`` object (an :class:`octavo.hooks.Register`) one plugin's hook receives for one kind."""

    def __init__(self, kind: str, info: PluginInfo):
        self.kind, self.info = kind, info

    def __repr__(self) -> str:
        return f"<register {self.kind} for plugin {self.info.name!r}>"

    def __call__(self, name: str, target: Any) -> None:
        where = f"plugin {self.info.name!r} (distribution {self.info.distribution!r})"
        if not isinstance(name, str) or not name:
            raise PluginError(f"{where} registered {self.kind} with name {name!r}; the name must be a non-empty str.")
        if isinstance(target, type):  # a class is accepted and stored as its lazy path
            target = f"{target.__module__}:{target.__qualname__}"
        if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
            raise PluginError(f"{where} registered {self.kind} {name!r} -> {target!r}; the target must be a "
                              "'package.module:ClassName' string.")
        self.info.registrations.append(Registration(self.kind, name, target, self.info.name, self.info.distribution))


class Registry:
    """Every kind's winning registrations, filled once from the loaded plugins."""

    def __init__(self) -> None:
        self.kinds: dict[str, str] = registry_kinds()  # kind -> register hook name
        self._winners: dict[str, dict[str, Registration]] = {kind: {} for kind in self.kinds}
        self._resolved: dict[tuple[str, str], Any] = {}

    def collect(self, pm: pluggy.PluginManager, plugins: dict[str, PluginInfo]) -> None:
        """Call every plugin's register hooks, one plugin at a time, then apply the shadowing rule."""
        everyone = pm.get_plugins()
        for kind, hook_name in self.kinds.items():
            for impl in getattr(pm.hook, hook_name).get_hookimpls():
                info = plugins[impl.plugin_name]
                # One plugin at a time through pluggy (so OCTAVO_TRACE_PLUGINS shows it), each with its own
                # register object, so every registration records who made it.
                caller = pm.subset_hook_caller(hook_name, remove_plugins=[p for p in everyone if p is not impl.plugin])
                try:
                    caller(register=RegisterCall(kind, info))
                except PluginError:
                    raise
                except Exception as e:
                    raise PluginError(f"plugin {info.name!r} (distribution {info.distribution!r}) failed in "
                                      f"{hook_name}: {type(e).__name__}: {e}") from e
        conflicts = []
        for kind in self.kinds:
            by_name: dict[str, list[Registration]] = {}
            for info in plugins.values():
                for reg in info.registrations:
                    if reg.kind == kind:
                        by_name.setdefault(reg.name, []).append(reg)
            for name, regs in by_name.items():
                third = [r for r in regs if not r.builtin]
                rivals = third if third else [r for r in regs if r.builtin]
                if len({r.target for r in rivals}) > 1:  # the same target twice is harmless
                    who = " and ".join(f"plugin {r.plugin!r} (distribution {r.distribution!r})" for r in rivals)
                    conflicts.append(f"{kind} name {name!r} is registered by both {who}.")
                    continue
                winner = rivals[0]
                for r in regs:
                    if r is not winner:
                        r.shadowed_by = f"{winner.plugin} ({winner.distribution})"
                self._winners[kind][name] = winner
        if conflicts:
            raise PluginConflictError(" ".join(conflicts) + " Uninstall one of them, or disable one with "
                                      "OCTAVO_DISABLE_PLUGINS=<plugin or distribution>.")

    def kind(self, kind: str) -> str:
        """``kind`` itself if it is a registry kind, else a ValueError listing the kinds."""
        if kind not in self.kinds:
            raise ValueError(f"Unknown plugin kind {kind!r}; one of {sorted(self.kinds)}.")
        return kind

    def names(self, kind: str) -> list[str]:
        """Registered names of one kind (shadowed registrations excluded), sorted."""
        return sorted(self._winners[self.kind(kind)])

    def registration(self, kind: str, name: str, failed: list[str] = ()) -> Registration:
        """The winning registration of ``name``; raises :class:`UnknownPluginError` if there is none."""
        reg = self._winners[self.kind(kind)].get(name)
        if reg is None:
            known = ", ".join(self.names(kind)) or "none"
            note = f" Plugins that failed to load: {'; '.join(failed)}." if failed else ""
            close = difflib.get_close_matches(name, self._winners[kind], n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise UnknownPluginError(f"No {kind.rstrip('s').replace('_', ' ')} named {name!r}.{hint} Registered "
                                     f"{kind}: {known}.{note} Run `octavo plugins` to see what is installed.")
        return reg

    def resolve(self, kind: str, name: str, failed: list[str] = ()) -> Any:
        """Import and return the class registered as ``name`` of ``kind`` (cached)."""
        key = (self.kind(kind), name)
        if key not in self._resolved:
            reg = self.registration(kind, name, failed)
            module_name, _, attr = reg.target.partition(":")
            try:
                obj = importlib.import_module(module_name)
                for part in attr.split("."):
                    obj = getattr(obj, part)
            except Exception as e:
                raise PluginError(f"{kind} {name!r} registered by plugin {reg.plugin!r} (distribution "
                                  f"{reg.distribution!r}) points to {reg.target!r}, which failed to import: "
                                  f"{type(e).__name__}: {e}") from e
            self._resolved[key] = obj
        return self._resolved[key]
