"""The plugin manager: discovers plugins (entry points of group ``octavo``), holds the registries, resolves
names to classes and makes the selection decisions (platform, attention backend).

Loading, once per process (``get_plugin_manager()``)::

    entry points ──filter (OCTAVO_PLUGINS / OCTAVO_DISABLE_PLUGINS)──> import each plugin module
        │  import error: recorded on the plugin and skipped (raised only if OCTAVO_PLUGINS asked for it)
        └─> pluggy.register ─> check hook names ─> call each plugin's register hooks with its own
            ``register`` object ─> registries {kind: {name: Registration}} with the shadowing rule:
            a third-party registration shadows a built-in one (distribution ``octavo``); two third-party
            registrations of one name raise PluginConflictError naming both distributions.

Targets stay lazy ``"module:Class"`` strings until ``resolve()``; nothing here imports torch.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as metadata
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import pluggy

from octavo.core import hookspecs
from octavo.errors import PluginConflictError, PluginError, UnknownPluginError  # noqa: F401 - re-exported
from octavo.hooks import ENTRY_POINT_GROUP, PROJECT_NAME

BUILTIN_DISTRIBUTION = "octavo"
#: registry kind -> the hook that fills it.
KINDS: dict[str, str] = {
    "platforms": "octavo_register_platforms",
    "attention_backends": "octavo_register_attention_backends",
    "models": "octavo_register_models",
    "quantizers": "octavo_register_quantizers",
    "speculators": "octavo_register_speculators",
}
#: platforms tried first when nothing is configured; unknown (third-party) platforms come next, cpu last.
PLATFORM_PREFERENCE = ["cuda", "rocm", "xpu", "hpu", "npu", "tpu", "mps"]
REFERENCE_ATTENTION_BACKEND = "torch_sdpa"


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
        return _norm(self.distribution) == BUILTIN_DISTRIBUTION


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
        return _norm(self.distribution) == BUILTIN_DISTRIBUTION


class _Register:
    """The ``register`` object one plugin's register hook receives for one kind."""

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


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return None
    return {_norm(x.strip()) for x in raw.split(",") if x.strip()}


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
        self._registry: dict[str, dict[str, Registration]] = {kind: {} for kind in KINDS}
        self._resolved: dict[tuple[str, str], Any] = {}
        if os.environ.get("OCTAVO_TRACE_PLUGINS", "") not in ("", "0", "false"):
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
            keys = {_norm(ep.name), _norm(dist)}
            builtin = _norm(dist) == BUILTIN_DISTRIBUTION
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
        self._check_hook_names()
        self._collect_registrations()

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
                close = difflib.get_close_matches(name, hookspecs.HOOK_GROUPS, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise PluginError(f"plugin {impl.plugin_name!r} implements unknown hook {name!r}.{hint} "
                                  "Known hooks are listed in docs/plugins.md and `octavo plugins --hooks`.")
        self._pm.check_pending()  # backstop: pluggy's own check

    def _collect_registrations(self) -> None:
        plugins = self._pm.get_plugins()
        for kind, hook_name in KINDS.items():
            for impl in getattr(self._pm.hook, hook_name).get_hookimpls():
                info = self.plugins[impl.plugin_name]
                others = [p for p in plugins if p is not impl.plugin]
                # One plugin at a time through pluggy (so OCTAVO_TRACE_PLUGINS shows it), each with its own
                # register object, so every registration records who made it.
                caller = self._pm.subset_hook_caller(hook_name, remove_plugins=others)
                try:
                    caller(register=_Register(kind, info))
                except PluginError:
                    raise
                except Exception as e:
                    raise PluginError(f"plugin {info.name!r} (distribution {info.distribution!r}) failed in "
                                      f"{hook_name}: {type(e).__name__}: {e}") from e
        conflicts = []
        for kind in KINDS:
            by_name: dict[str, list[Registration]] = {}
            for info in self.plugins.values():
                for reg in info.registrations:
                    if reg.kind == kind:
                        by_name.setdefault(reg.name, []).append(reg)
            for name, regs in by_name.items():
                third = [r for r in regs if not r.builtin]
                builtin = [r for r in regs if r.builtin]
                rivals = third if third else builtin
                if len({r.target for r in rivals}) > 1:  # the same target twice is harmless
                    who = " and ".join(f"plugin {r.plugin!r} (distribution {r.distribution!r})" for r in rivals)
                    conflicts.append(f"{kind} name {name!r} is registered by both {who}.")
                    continue
                winner = rivals[0]
                for r in regs:
                    if r is not winner:
                        r.shadowed_by = f"{winner.plugin} ({winner.distribution})"
                self._registry[kind][name] = winner
        if conflicts:
            raise PluginConflictError(" ".join(conflicts) + " Uninstall one of them, or disable one with "
                                      "OCTAVO_DISABLE_PLUGINS=<plugin or distribution>.")

    # ---------------------------------------------------------------- lookups
    def names(self, kind: str) -> list[str]:
        """Registered names of one kind (shadowed registrations excluded), sorted."""
        return sorted(self._registry[self._kind(kind)])

    def registration(self, kind: str, name: str) -> Registration:
        """The winning registration of ``name``; raises :class:`UnknownPluginError` if there is none."""
        reg = self._registry[self._kind(kind)].get(name)
        if reg is None:
            known = ", ".join(self.names(kind)) or "none"
            failed = [f"{p.name} ({p.error})" for p in self.plugins.values() if p.error]
            note = f" Plugins that failed to load: {'; '.join(failed)}." if failed else ""
            close = difflib.get_close_matches(name, self._registry[kind], n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise UnknownPluginError(f"No {kind.rstrip('s').replace('_', ' ')} named {name!r}.{hint} Registered "
                                     f"{kind}: {known}.{note} Run `octavo plugins` to see what is installed.")
        return reg

    def resolve(self, kind: str, name: str) -> Any:
        """Import and return the class registered as ``name`` of ``kind``."""
        key = (self._kind(kind), name)
        if key not in self._resolved:
            reg = self.registration(kind, name)
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

    @staticmethod
    def _kind(kind: str) -> str:
        if kind not in KINDS:
            raise ValueError(f"Unknown plugin kind {kind!r}; one of {sorted(KINDS)}.")
        return kind

    # ---------------------------------------------------------------- selection
    def select_platform(self, settings: Any) -> Any:
        """The platform instance: explicit ``settings.device.device``, else the hook, else preference order."""
        explicit = settings.device.device if settings is not None else None
        chosen, why = (explicit, "device setting") if explicit else (
            self.hook.octavo_select_platform(settings=settings), "octavo_select_platform hook")
        if chosen:
            cls = self.resolve("platforms", chosen)
            ok = cls.is_available()
            if not ok:
                raise PluginError(f"Platform {chosen!r} (chosen by the {why}) is not available here: {ok.reason}. "
                                  f"Pick another with --device, one of {self.names('platforms')}.")
            return cls()
        reasons = {}
        for name in self._platform_order():
            ok, reason = self.availability("platforms", name)
            if ok:
                return self.resolve("platforms", name)()
            reasons[name] = reason
        raise PluginError("No platform is available here: " + "; ".join(f"{n}: {r}" for n, r in reasons.items()))

    def _platform_order(self) -> list[str]:
        names = self.names("platforms")
        first = [n for n in PLATFORM_PREFERENCE if n in names]
        rest = [n for n in names if n not in first and n != "cpu"]
        return first + rest + (["cpu"] if "cpu" in names else [])

    def select_attention_backend(self, settings: Any, platform: Any, *, dtype: Any, head_size: int,
                                 sliding_window: int | None = None, logits_soft_cap: float | None = None,
                                 block_size: int = 16) -> Any:
        """The attention backend class for one layer shape: explicit setting, else the hook, else the
        platform's preference list filtered by ``is_available()`` and ``supports(...)``, torch_sdpa last."""
        shape = dict(dtype=dtype, head_size=head_size, sliding_window=sliding_window,
                     logits_soft_cap=logits_soft_cap, block_size=block_size)

        def check(name: str) -> tuple[Any, str | None]:
            cls = self.resolve("attention_backends", name)
            ok = cls.is_available()
            if ok:
                ok = cls.supports(device_type=platform.device_type, **shape)
            return (cls, None) if ok else (None, getattr(ok, "reason", None) or "not supported")

        explicit = settings.device.attention_backend if settings is not None else None
        chosen, why = (explicit, "attention_backend setting") if explicit else (
            self.hook.octavo_select_attention_backend(settings=settings, platform=platform, **shape),
            "octavo_select_attention_backend hook")
        if chosen:
            cls, reason = check(chosen)
            if cls is None:
                raise PluginError(f"Attention backend {chosen!r} (chosen by the {why}) cannot run this model here: "
                                  f"{reason}. Pick another with --attention-backend, one of "
                                  f"{self.names('attention_backends')}.")
            return cls
        candidates = list(platform.preferred_attention_backends())
        if REFERENCE_ATTENTION_BACKEND not in candidates:
            candidates.append(REFERENCE_ATTENTION_BACKEND)
        reasons = {}
        for name in candidates:
            if name not in self._registry["attention_backends"]:
                reasons[name] = "not registered"
                continue
            try:
                cls, reasons[name] = check(name)
            except PluginError as e:
                cls, reasons[name] = None, str(e)
            if cls is not None:
                return cls
        raise PluginError(f"No attention backend supports head_size={head_size}, dtype={dtype} on "
                          f"{platform.device_type}: " + "; ".join(f"{n}: {r}" for n, r in reasons.items()))

    # ---------------------------------------------------------------- reporting
    def report(self) -> list[dict[str, Any]]:
        """One dict per plugin, as ``octavo plugins --json`` prints it."""
        out = []
        for info in self.plugins.values():
            regs = []
            for r in info.registrations:
                entry = {"kind": r.kind, "name": r.name, "target": r.target, "shadowed_by": r.shadowed_by}
                if r.kind in ("platforms", "attention_backends"):
                    if r.shadowed_by is None:
                        entry["available"], entry["reason"] = self.availability(r.kind, r.name)
                    else:
                        entry["available"], entry["reason"] = False, f"shadowed by {r.shadowed_by}"
                regs.append(entry)
            out.append({"name": info.name, "distribution": info.distribution, "version": info.version,
                        "module": info.module, "builtin": info.builtin, "hooks": info.hooks,
                        "registrations": regs, "error": info.error})
        return out


def _discover() -> list[metadata.EntryPoint]:
    """Entry points of group ``octavo``, de-duplicated (a distribution seen twice on sys.path counts once),
    third-party first and built-ins last, each group sorted by name, so load order is stable."""
    seen, eps = set(), []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else ""
        if (_norm(dist), ep.name) not in seen:
            seen.add((_norm(dist), ep.name))
            eps.append(ep)
    return sorted(eps, key=lambda ep: (_norm(ep.dist.name if ep.dist else "") == BUILTIN_DISTRIBUTION, ep.name))


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


def reset_plugin_manager() -> None:
    """Forget the process-wide manager so the next call reloads (tests; after changing OCTAVO_* plugin vars)."""
    global _PM
    with _LOCK:
        _PM = None
