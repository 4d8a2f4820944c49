"""The plugin manager: discovers plugins (entry points of group ``octavo``), loads them in order and is the
one object the engine asks (``get_plugin_manager()``). Its other jobs live beside it: the registries and
the shadowing rule in ``plugin_registry``, the selection defaults in ``plugin_selection``, the report in
``octavo.cli.plugins_report``.

Loading, once per process::

    entry points (plugin_discovery: read once, again only when the installed metadata changed)
        ──filter (OCTAVO_PLUGINS / OCTAVO_DISABLE_PLUGINS)──> import each plugin module
        │  import error: recorded on the plugin and skipped (raised only if OCTAVO_PLUGINS asked for it)
        └─> pluggy.register ─> + the built-in selection defaults (trylast) ─> check hook names
            ─> Registry.collect: each plugin's register hooks, shadowing, conflicts

Public access for plugin authors and tools is ``octavo.registry``; nothing here imports torch.
"""

from __future__ import annotations

import difflib
import importlib.metadata as metadata
import os
import sys
import threading
from typing import Any

import pluggy

from octavo.core import hookspecs
from octavo.core.plugin_discovery import clear_cache as clear_discovery_cache
from octavo.core.plugin_discovery import discover as _discover
from octavo.core.plugin_registry import (  # noqa: F401 - re-exported for the old import paths
    BUILTIN_DISTRIBUTION,
    PluginInfo,
    Registration,
    Registry,
    norm,
)
from octavo.core.plugin_selection import (
    DEFAULTS_PLUGIN,
    DefaultSelection,
    select_attention_backend,
    select_platform,
)
from octavo.env_flags import env_choice
from octavo.errors import PluginConflictError, PluginError, UnknownPluginError  # noqa: F401 - re-exported
from octavo.hooks import PROJECT_NAME


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return None
    return {norm(x.strip()) for x in raw.split(",") if x.strip()}


class PluginManager:
    """octavo's plugin manager. Use :func:`get_plugin_manager` for the process-wide instance.

    Attributes:
        hook: the pluggy hook relay (``pm.hook.octavo_on_engine_start(settings=...)``).
        plugins: plugin name -> :class:`PluginInfo`, failed ones included (with ``error`` set).
        disabled: plugin names skipped because of OCTAVO_DISABLE_PLUGINS or OCTAVO_PLUGINS.
    """

    def __init__(self, *, load: bool = True, plugins: tuple[tuple[str, Any, str], ...] = ()):
        """Build the manager.

        Args:
            load: discover installed plugins (entry points of group ``octavo``) and fill the registries.
            plugins: extra ``(name, plugin object, distribution)`` triples registered after the installed
                ones, unfiltered by the OCTAVO_* variables (embedding, tests).
        """
        self._pm = pluggy.PluginManager(PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self.hook = self._pm.hook
        self.plugins: dict[str, PluginInfo] = {}
        self.disabled: list[str] = []
        self.registry = Registry()
        # 1/0; "true"/"false" too (unset or "false" was off before the value was checked, any other value on)
        if env_choice("OCTAVO_TRACE_PLUGINS", ("1", "0", "true", "false"), "0") in ("1", "true"):
            self._pm.trace.root.setwriter(lambda s: sys.stderr.write("[octavo-plugins] " + s))
            self._pm.enable_tracing()
        if load:
            self.load(extra=plugins)

    # ---------------------------------------------------------------- loading
    def load(self, entry_points: list[metadata.EntryPoint] | None = None,
             extra: tuple[tuple[str, Any, str], ...] = ()) -> None:
        """Discover, import and register plugins (plus ``extra`` ones), then fill the registries."""
        allow, disable = _env_list("OCTAVO_PLUGINS"), _env_list("OCTAVO_DISABLE_PLUGINS") or set()
        eps = entry_points if entry_points is not None else _discover()
        asked = set()
        for ep in eps:
            dist = ep.dist.name if ep.dist is not None else "unknown"
            version = ep.dist.version if ep.dist is not None else "?"
            keys = {norm(ep.name), norm(dist)}
            builtin = norm(dist) == BUILTIN_DISTRIBUTION
            asked |= keys & (allow or set())
            if keys & disable or (allow is not None and not builtin and not keys & allow):
                self.disabled.append(ep.name)
                continue
            explicit = allow is not None and bool(keys & allow)
            info = PluginInfo(ep.name, dist, version, ep.value)
            if ep.name in self.plugins:
                other = self.plugins[ep.name].distribution
                info.error = (f"plugin name {ep.name!r} is already used by distribution {other!r}; "
                              "rename the entry point in one of them")
                self.plugins[f"{dist}:{ep.name}"] = info
                continue
            self.plugins[ep.name] = info
            try:
                obj = ep.load()
            except Exception as e:  # noqa: BLE001 - any import failure is recorded, not fatal
                if explicit:
                    raise PluginError(f"plugin {ep.name!r} (distribution {dist!r}) was asked for in OCTAVO_PLUGINS "
                                      f"but failed to import: {type(e).__name__}: {e}") from e
                info.error = f"{type(e).__name__}: {e}"
                continue
            self._register(obj, info)
        for name, obj, dist in extra:
            self._register(obj, self.plugins.setdefault(name, PluginInfo(name, dist, "0", repr(obj))))
        if allow is not None and allow - asked:
            installed = sorted({p.name for p in self.plugins.values()} | set(self.disabled))
            raise PluginError(f"OCTAVO_PLUGINS names {sorted(allow - asked)}, which are not installed plugins or "
                              f"distributions; installed: {installed}. Fix the names or pip install the plugin.")
        if self._pm.get_plugin(DEFAULTS_PLUGIN) is None:
            self._pm.register(DefaultSelection(self), name=DEFAULTS_PLUGIN)
        self._check_hook_names()
        self.registry.collect(self._pm, self.plugins)

    def _register(self, obj: Any, info: PluginInfo) -> None:
        try:
            self._pm.register(obj, name=info.name)
        except (pluggy.PluginValidationError, ValueError) as e:
            raise PluginError(f"plugin {info.name!r} (distribution {info.distribution!r}): {e}") from None
        info.hooks = sorted(c.name for c in self._pm.get_hookcallers(obj) or [])

    def _check_hook_names(self) -> None:
        """A hookimpl whose name matches no hookspec is a typo: fail with the plugin and the closest hook."""
        for name, caller in vars(self._pm.hook).items():
            if not isinstance(caller, pluggy.HookCaller) or caller.spec is not None:
                continue
            for impl in caller.get_hookimpls():
                if impl.optionalhook:
                    continue
                close = difflib.get_close_matches(name, hookspecs.hook_groups(), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise PluginError(f"plugin {impl.plugin_name!r} implements unknown hook {name!r}.{hint} "
                                  "Known hooks are listed in docs/plugins.md and `octavo plugins --hooks`.")
        self._pm.check_pending()  # backstop: pluggy's own check

    # ---------------------------------------------------------------- lookups
    @property
    def kinds(self) -> list[str]:
        """The registry kinds, derived from the ``octavo_register_<kind>`` hookspecs."""
        return list(self.registry.kinds)

    def _failed(self) -> list[str]:
        return [f"{p.name} ({p.error})" for p in self.plugins.values() if p.error]

    def names(self, kind: str) -> list[str]:
        """Registered names of one kind (shadowed registrations excluded), sorted."""
        return self.registry.names(kind)

    def registration(self, kind: str, name: str) -> Registration:
        """The winning registration of ``name``; raises :class:`UnknownPluginError` if there is none."""
        return self.registry.registration(kind, name, self._failed())

    def resolve(self, kind: str, name: str) -> Any:
        """Import and return the class registered as ``name`` of ``kind``."""
        return self.registry.resolve(kind, name, self._failed())

    def availability(self, kind: str, name: str) -> tuple[bool, str | None]:
        """Whether a registered platform or attention backend can run here, and why not."""
        try:
            result = self.resolve(kind, name).is_available()
        except Exception as e:  # noqa: BLE001 - reported, not raised: this feeds `octavo plugins`
            return False, f"{type(e).__name__}: {e}"
        return bool(result), getattr(result, "reason", None)

    def stat_loggers(self, settings: Any = None) -> list[Any]:
        """Objects from ``octavo_register_stat_loggers``; resolved once by the engine, then called directly."""
        loggers: list[Any] = []
        self.hook.octavo_register_stat_loggers(register=loggers.append, settings=settings)
        for obj in loggers:
            if not callable(getattr(obj, "record", None)):
                raise PluginError(f"stat logger {obj!r} has no record(stats, outputs) method.")
        return loggers

    def first_answer(self, hook_name: str, **kwargs: Any) -> tuple[Any, str]:
        """Call a firstresult hook; return the answer and who gave it (a plugin's hook, else the built-in
        default, asked only when no plugin answered)."""
        defaults = self._pm.get_plugin(DEFAULTS_PLUGIN)
        answer = self._pm.subset_hook_caller(hook_name, remove_plugins=[defaults])(**kwargs)
        if answer is not None:
            return answer, f"{hook_name} hook"
        return self._pm.subset_hook_caller(hook_name, remove_plugins=[
            p for p in self._pm.get_plugins() if p is not defaults])(**kwargs), "built-in default"

    # ---------------------------------------------------------------- selection (see plugin_selection)
    def select_platform(self, settings: Any) -> Any:
        """The platform instance: explicit ``settings.device.device``, else the hook (default included)."""
        return select_platform(self, settings)

    def select_attention_backend(self, settings: Any, platform: Any, **shape: Any) -> Any:
        """The attention backend class for the model; see :func:`plugin_selection.select_attention_backend`."""
        return select_attention_backend(self, settings, platform, **shape)

    def report(self) -> list[dict[str, Any]]:
        """One dict per plugin, as ``octavo plugins --json`` prints it (built in ``octavo.cli.plugins_report``)."""
        from octavo.cli.plugins_report import build_report

        return build_report(self)


_PM: PluginManager | None = None
_LOCK = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, loaded on first use (safe to call in every process)."""
    global _PM
    if _PM is None:
        with _LOCK:
            if _PM is None:
                _PM = PluginManager()
    return _PM


def reset_plugin_manager(*, rescan: bool = False) -> None:
    """Forget the process-wide manager so the next call reloads (tests; after changing OCTAVO_* plugin vars).
    Installed or removed distributions are noticed without ``rescan``; it forces a fresh metadata read too."""
    global _PM
    with _LOCK:
        _PM = None
    if rescan:
        clear_discovery_cache()
