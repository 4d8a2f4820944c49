"""Selection: which platform and which attention backend an engine uses.

Order of authority, for each decision::

    explicit setting (--device / --attention-backend)
      > octavo_select_* hookimpls of plugins           (firstresult: the first non-None answer)
      > the built-in default below, a ``trylast`` hookimpl, so any plugin outranks it

Whatever decides, the choice is checked (registered, ``is_available()``, and for a backend
``supports(...)``), and a failed check stops the engine with the reason and the alternatives. The defaults
know no vendor: a platform ranks itself (``Platform.priority``), a backend names the platforms it suits
(``AttentionBackend.platform_priority``), and a platform may put its own favourites first
(``preferred_attention_backends()``). ``torch_sdpa``, the reference backend, is always the last resort.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from octavo.errors import PluginError
from octavo.hooks import hookimpl

if TYPE_CHECKING:
    import torch

    from octavo.attention import AttentionBackend
    from octavo.config import OctavoSettings
    from octavo.core.plugin_manager import PluginManager
    from octavo.platform import Platform

logger = logging.getLogger("octavo.plugins")

REFERENCE_ATTENTION_BACKEND = "torch_sdpa"
DEFAULTS_PLUGIN = "octavo-defaults"


class DefaultSelection:
    """The built-in answers to the select hooks, registered by the plugin manager as plugin ``octavo-defaults``."""

    def __init__(self, pm: PluginManager) -> None:
        self.pm = pm

    @hookimpl(trylast=True)
    def octavo_select_platform(self, settings: OctavoSettings | None) -> str:
        """The available platform with the highest ``priority`` (ties by name)."""
        names = self.pm.names("platforms")
        ranked = sorted(names, key=lambda n: (-_priority(self.pm, n), n))
        reasons = {}
        for name in ranked:
            ok, reason = self.pm.availability("platforms", name)
            if ok:
                return name
            reasons[name] = reason
        raise PluginError("No platform is available here: " + "; ".join(f"{n}: {r}" for n, r in reasons.items()))

    @hookimpl(trylast=True)
    def octavo_select_attention_backend(self, platform: Platform, dtype: torch.dtype, head_size: int,
                                        sliding_window: int | None, logits_soft_cap: float | None,
                                        block_size: int) -> str:
        """The platform's favourites, then backends by their priority for this platform, ``torch_sdpa`` last."""
        shape = dict(dtype=dtype, head_size=head_size, sliding_window=sliding_window,
                     logits_soft_cap=logits_soft_cap, block_size=block_size)
        candidates = list(platform.preferred_attention_backends())
        ranked = []
        for name in self.pm.names("attention_backends"):
            try:
                rank = self.pm.resolve("attention_backends", name).platform_priority.get(platform.name)
            except (PluginError, AttributeError):
                continue  # reported with its reason by `octavo plugins`; not a candidate here
            if rank is not None:
                ranked.append((-rank, name))
        candidates += [n for _, n in sorted(ranked) if n not in candidates]
        if REFERENCE_ATTENTION_BACKEND not in candidates:
            candidates.append(REFERENCE_ATTENTION_BACKEND)
        reasons = {}
        for name in candidates:
            cls, reasons[name] = check_backend(self.pm, name, platform, shape)
            if cls is not None:
                return name
        raise PluginError(f"No attention backend supports head_size={head_size}, dtype={dtype} on platform "
                          f"{platform.name}: " + "; ".join(f"{n}: {r}" for n, r in reasons.items()))


def _priority(pm: PluginManager, name: str) -> int:
    try:
        return int(getattr(pm.resolve("platforms", name), "priority", 0))
    except PluginError:
        return 0


def check_backend(pm: PluginManager, name: str, platform: Platform,
                  shape: dict[str, Any]) -> tuple[type[AttentionBackend] | None, str | None]:
    """``(class, None)`` if backend ``name`` is registered, available and supports ``shape`` on this
    platform, else ``(None, reason)``."""
    if name not in pm.names("attention_backends"):
        return None, "not registered"
    try:
        cls = pm.resolve("attention_backends", name)
        ok = cls.is_available()
        if ok:
            ok = cls.supports(device_type=platform.device_type, **shape)
    except PluginError as e:
        return None, str(e)
    return (cls, None) if ok else (None, getattr(ok, "reason", None) or "not supported")


def select_platform(pm: PluginManager, settings: OctavoSettings | None) -> Platform:
    """The platform instance: explicit ``settings.device.device``, else the select hook (default included)."""
    explicit = settings.device.device if settings is not None else None
    chosen, why = (explicit, "device setting") if explicit else (
        pm.first_answer("octavo_select_platform", settings=settings))
    cls = pm.resolve("platforms", chosen)
    ok = cls.is_available()
    if not ok:
        raise PluginError(f"Platform {chosen!r} (chosen by the {why}) is not available here: {ok.reason}. "
                          f"Pick another with --device, one of {pm.names('platforms')}.")
    logger.info("platform %s (chosen by the %s)", chosen, why)
    return cls()


def select_attention_backend(pm: PluginManager, settings: OctavoSettings | None, platform: Platform, *,
                             dtype: torch.dtype, head_size: int, sliding_window: int | None = None,
                             logits_soft_cap: float | None = None, block_size: int = 16) -> type[AttentionBackend]:
    """The attention backend class for the model (one per model: the arguments describe its first paged
    layer, ``sliding_window`` the largest window): explicit setting, else the select hook (default included)."""
    shape = dict(dtype=dtype, head_size=head_size, sliding_window=sliding_window,
                 logits_soft_cap=logits_soft_cap, block_size=block_size)
    explicit = settings.device.attention_backend if settings is not None else None
    chosen, why = (explicit, "attention_backend setting") if explicit else (
        pm.first_answer("octavo_select_attention_backend", settings=settings, platform=platform, **shape))
    if explicit:
        pm.registration("attention_backends", chosen)  # an unknown name: UnknownPluginError with the list
    cls, reason = check_backend(pm, chosen, platform, shape)
    if cls is None:
        raise PluginError(f"Attention backend {chosen!r} (chosen by the {why}) cannot run this model here: "
                          f"{reason}. Pick another with --attention-backend, one of "
                          f"{pm.names('attention_backends')}.")
    logger.info("attention backend %s (chosen by the %s)", chosen, why)
    return cls

