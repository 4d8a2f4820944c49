"""Step N's tokens for its grammar rows, handed to N+1's native fill so the accept runs in the same C call (session 15,
opt-in ``OCTAVO_GRAMMAR_NATIVE_ACCEPT``: core/grammar_device_gate.py NATIVE_ACCEPT).

Why (issue 11, GPU, 135M shape, batch 32, 2x H200 32-core host, session 15's first call): the core thread's accept of
N's tokens (one batched xgrammar call through Python, 0.10 ms a step) sits on the host-bound step's critical path,
before update N and schedule N+2. When N+1's rows are N's rows (the steady decode step: core/grammar_rows.py reuses
the same list), the native fill can accept row j's token and then fill row j, on the shim's C threads, without the
GIL (plugins/structured_output/xgrammar_native.py). The backend takes it only where nothing changes: no row
terminated and no stop token among the tokens (the matchers' terminated flags are kept in Python); anywhere else it
calls this object, which accepts in Python first, as before.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("octavo.core.structured_output")


class RowsAccept:
    """The accept of ``tokens`` by ``matchers`` (request ids ``rids``) that a fill may take over. Calling it accepts
    in Python now (once); a native fill that took it sets ``done`` and later reports :meth:`native`."""

    rows_accept = True  # (how core/async_gate.py tells it from a plain ``before`` callable)
    __slots__ = ("manager", "matchers", "tokens", "rids", "done")

    def __init__(self, manager: Any, matchers: list[Any], tokens: list[int], rids: list[str]) -> None:
        self.manager, self.matchers, self.tokens, self.rids = manager, matchers, tokens, rids
        self.done = False

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            self.manager._accept(self.matchers, self.tokens, self.rids)  # noqa: SLF001

    def native(self, ok: bytes) -> None:
        """The C accept's per-row results: ``1`` accepted, ``0`` refused (a warning, as the Python accept logs; the
        matcher did not move), ``2`` the call failed (raised: the step fails, as a failing Python accept would)."""
        check_accepted(ok, self.rids, self.tokens, "native", "OCTAVO_GRAMMAR_NATIVE_ACCEPT")


def check_accepted(ok: bytes | list[int], rids: list[str], tokens: list[int], how: str, switch: str) -> None:
    """Per-row results of an accept done in C (the native fill's, the chained fill's): ``1`` accepted, ``0`` refused
    (a warning, as the Python accept logs; the matcher did not move), ``2`` the call failed (raised, naming the row's
    request and the ``switch`` that turns the C accept off: the step fails, as a failing Python accept would)."""
    if ok.count(1) == len(ok):
        return
    for j, r in enumerate(ok):
        if r == 0:
            logger.warning("request %s: token %d breaks its grammar", rids[j], tokens[j])
    bad = [j for j, r in enumerate(ok) if r == 2]
    if bad:
        raise RuntimeError(f"structured outputs: the {how} accept of request {rids[bad[0]]}'s token "
                           f"{tokens[bad[0]]} failed ({switch}=0 accepts in Python)")
