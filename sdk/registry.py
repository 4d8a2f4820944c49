"""The public door to the loaded plugins: look names up, resolve them to classes, ask what would be selected.

    from octavo.registry import names, resolve, select_platform

    names("attention_backends")                  # ['flashinfer', 'torch_sdpa', 'triton', ...]
    resolve("platforms", "cpu")                  # the class registered as "cpu" (shadowing applied)
    select_platform()                            # the platform instance an engine would use here

Plugin authors, tests and tools use this module instead of ``octavo.core``; the plugin manager behind it is
process-wide and loaded on first use (``get_plugin_manager()``). Kinds are the names of the register hooks
(``octavo_register_<kind>``): ``platforms``, ``attention_backends``, ``models``, ``quantizers``, ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from octavo.attention import AttentionBackend
    from octavo.config import OctavoSettings
    from octavo.platform import Platform


def get_plugin_manager() -> Any:
    """The process-wide plugin manager (``.hook``, ``.names``, ``.resolve``, ``.plugins``, ``.kinds``)."""
    from octavo.core.plugin_manager import get_plugin_manager as _get

    return _get()


def reload_plugins(*, rescan: bool = False) -> None:
    """Forget the loaded plugins; the next call reloads them (after changing ``OCTAVO_PLUGINS`` and friends).

    The installed plugins' entry points are read once per process and again whenever a distribution on
    ``sys.path`` is installed, removed or its metadata edited; ``rescan=True`` reads them again regardless
    (for distributions a custom import finder serves)."""
    from octavo.core.plugin_manager import reset_plugin_manager

    reset_plugin_manager(rescan=rescan)


def kinds() -> list[str]:
    """Every registry kind (``platforms``, ``attention_backends``, ``models``, ...)."""
    return get_plugin_manager().kinds


def names(kind: str) -> list[str]:
    """Registered names of one kind, shadowed ones excluded, sorted."""
    return get_plugin_manager().names(kind)


def resolve(kind: str, name: str) -> Any:
    """Import and return the class registered as ``name`` of ``kind``.

    Raises:
        octavo.errors.UnknownPluginError: no plugin registered ``name`` (the message lists what is registered).
        octavo.errors.PluginError: the registered target failed to import.
    """
    return get_plugin_manager().resolve(kind, name)


def availability(kind: str, name: str) -> tuple[bool, str | None]:
    """Whether a registered platform or attention backend can run here, and the reason when it cannot."""
    return get_plugin_manager().availability(kind, name)


def select_platform(settings: OctavoSettings | None = None) -> Platform:
    """The platform instance an engine with ``settings`` would use here (``--device``, hooks, priorities)."""
    if settings is None:
        from octavo.config import OctavoSettings

        settings = OctavoSettings()
    return get_plugin_manager().select_platform(settings)


def select_attention_backend(platform: Platform, *, dtype: Any, head_size: int, settings: OctavoSettings | None = None,
                             sliding_window: int | None = None, logits_soft_cap: float | None = None,
                             block_size: int = 16) -> type[AttentionBackend]:
    """The attention backend class an engine would use for a model of this shape on ``platform``."""
    return get_plugin_manager().select_attention_backend(
        settings, platform, dtype=dtype, head_size=head_size, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, block_size=block_size)
