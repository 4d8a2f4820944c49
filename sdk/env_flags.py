"""Values read from ``OCTAVO_*`` environment variables by the code that acts on them (kernel choices, fusions,
timeouts, sizes): switches, choices among named values, and numbers.

Every reader refuses a value it does not accept with an error that names the variable and the accepted values,
never silently reading it as "on", "off" or the default. Unset or empty (white space included) means the default.
"""

from __future__ import annotations

import os


def env_switch(name: str, default: bool = True) -> bool:
    """``os.environ[name]`` as a switch: unset or empty -> ``default``, ``"1"`` -> True, ``"0"`` -> False."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if raw not in ("0", "1"):
        raise ValueError(f"{name}={raw!r}: use 1 (on) or 0 (off)")
    return raw == "1"


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """``os.environ[name]`` as one of ``choices`` (compared exactly, after stripping white space): unset or empty
    -> ``default``; any other value is refused with the list."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if raw not in choices:
        raise ValueError(f"{name}={raw!r}: use one of {', '.join(choices)}")
    return raw


def env_int(name: str, default: int, minimum: int | None = None, maximum: int | None = None) -> int:
    """``os.environ[name]`` as a whole number within ``[minimum, maximum]`` (each bound optional): unset or empty
    -> ``default``."""
    return _number(name, default, int, "a whole number", minimum, maximum)


def env_float(name: str, default: float, minimum: float | None = None, maximum: float | None = None) -> float:
    """``os.environ[name]`` as a finite number within ``[minimum, maximum]`` (each bound optional): unset or empty
    -> ``default``."""
    return _number(name, default, float, "a number", minimum, maximum)


def _number(name: str, default, kind, what: str, minimum, maximum):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    bounds = "".join([f" >= {minimum}" if minimum is not None else "",
                      " and" if minimum is not None and maximum is not None else "",
                      f" <= {maximum}" if maximum is not None else ""])
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or value != value or value in (float("inf"), float("-inf")) \
            or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name}={raw!r}: use {what}{bounds} (unset: {default})")
    return value
