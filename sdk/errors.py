"""Every exception octavo raises on purpose, in one public module: catch these, never a class from
``octavo.core``.

    from octavo.errors import EngineDeadError, EngineStartError, PluginError

Each class keeps the builtin base it had before this module existed (``RuntimeError`` / ``ValueError``),
so ``except RuntimeError`` in older code still catches it; all share :class:`OctavoError`. The old private
paths (``octavo.core.engine_client.EngineDeadError``, ``octavo.core.plugin_manager.PluginError``, ...)
re-export these same classes for one release.
"""

from __future__ import annotations

__all__ = [
    "OctavoError",
    "ConfigError",
    "EngineDeadError",
    "EngineStartError",
    "PluginError",
    "UnknownPluginError",
    "PluginConflictError",
    "APIError",
    "InputError",
]


class OctavoError(Exception):
    """Base of every exception octavo raises on purpose (``except octavo.errors.OctavoError``)."""


class ConfigError(OctavoError, ValueError):
    """An invalid setting: the message names the field and how to fix it."""


class InputError(OctavoError, ValueError):
    """Invalid request input (prompt, messages, sampling parameters), refused before anything is queued.

    Args:
        message: what is wrong and how to fix it.
        param: the request field at fault (``"prompt"``, ``"messages"``, ``"logprobs"``, ...), or None.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineDeadError(OctavoError, RuntimeError):
    """The engine core is gone (its process died or a step failed); no request can be served any more."""


class EngineStartError(OctavoError, RuntimeError):
    """The engine core could not start; the message carries the real reason from the core."""


class PluginError(OctavoError, RuntimeError):
    """A plugin problem; the message names the plugin, its distribution and the fix."""


class UnknownPluginError(PluginError, ValueError):
    """A name that no loaded plugin registered (the message lists the registered ones)."""


class PluginConflictError(PluginError):
    """Two third-party plugins registered the same name (the message names both distributions)."""


class APIError(OctavoError):
    """An error the OpenAI-compatible server answers in OpenAI's shape with HTTP ``status``; a route added
    by ``octavo_add_routes`` may raise it too.

    Args:
        status: the HTTP status code.
        message: what the client reads in ``error.message``.
        param: the request field at fault, if any.
        code: ``error.code``; defaults to ``status``.
        headers: extra response headers (e.g. ``Retry-After``).
    """

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | int | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers
        self.code = code if code is not None else status
