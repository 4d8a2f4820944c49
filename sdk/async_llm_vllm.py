"""``AsyncLLM`` methods vLLM's async engine client has beyond generation: sleep mode and ``collective_rpc``.

Each is a utility call to the engine core (its own process, or this one), answered between steps.
"""

from __future__ import annotations

from typing import Any


class AsyncVllmMethods:
    """Mixed into :class:`octavo.AsyncLLM`; uses its ``_client.call_utility``."""

    async def _utility(self, method: str, *args: Any) -> Any:
        self._ensure_output_task()
        return await self._client.call_utility(method, *args)

    async def sleep(self, level: int = 1) -> dict:
        """Free the KV cache and offload (level 1) or drop (level 2) the weights; see ``LLM.sleep``."""
        return await self._utility("sleep", level)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore what ``sleep`` freed (``tags``: ``weights`` and/or ``kv_cache``; default both)."""
        await self._utility("wake_up", tags)

    async def is_sleeping(self) -> bool:
        return await self._utility("is_sleeping")

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                             kwargs: dict | None = None) -> list:
        """Run a worker method (a name or ``"module:function"``) on every rank; results by rank."""
        if not isinstance(method, str):
            raise TypeError("AsyncLLM.collective_rpc takes a method name or 'module:function' (the engine core runs "
                            "in another process; octavo sends no pickled code).")
        return await self._utility("collective_rpc", method, list(args), dict(kwargs or {}), timeout)
