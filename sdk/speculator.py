"""The ``Speculator`` interface: proposes draft tokens that the core verifies.

The core verifies every draft exactly (greedy) or by rejection sampling, so a speculator can only change
speed, never the output distribution.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar


class Speculator(ABC):
    """Proposes up to ``num_speculative_tokens`` draft tokens per request each step."""

    name: ClassVar[str]

    def __init__(self, *, num_speculative_tokens: int, settings: Any = None) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.settings = settings

    @abstractmethod
    def propose(self, token_ids: list[list[int]]) -> list[list[int]]:
        """Given each request's prompt+output token ids so far, return each request's draft tokens
        (possibly none). Runs on the host, in the engine-core process, once per step."""
