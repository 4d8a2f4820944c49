"""The output loop of :class:`octavo.AsyncLLM`: one asyncio task reads the engine core's step outputs, turns
them into ``RequestOutput`` objects (the front end detokenizes and applies stop strings) and puts each into its
request's queue (see ``octavo.async_stream.RequestStream``); it also feeds the stats, finished and dead
observers (metrics, the server), and fails every open request if the core dies or the loop itself breaks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from octavo.errors import InputError
from octavo.outputs import RequestOutput

logger = logging.getLogger("octavo.async_llm")


class AsyncOutputLoop:
    """Mixed into :class:`octavo.AsyncLLM`; uses its ``_client``, ``frontend``, ``_queues``, ``_not_started``
    and observer lists (set up in ``AsyncLLM._setup``)."""

    def _ensure_output_task(self) -> None:
        if self._output_task is None:
            self._output_task = asyncio.get_running_loop().create_task(self._output_loop(),
                                                                       name="octavo-output-loop")

    async def _output_loop(self) -> None:
        from octavo.errors import EngineDeadError

        fe = self.frontend
        try:
            while True:
                core_outs = await self._client.get_output()
                if core_outs.stats is not None:
                    self.stats = core_outs.stats
                    for obs in self.stats_observers:
                        _notify(obs, core_outs.stats)
                if not core_outs.outputs:
                    continue
                for o in core_outs.outputs:
                    if o.new_token_ids or o.error:
                        self._not_started.discard(fe.parent_of(o.request_id))
                results, to_abort = fe.process_outputs(core_outs.outputs)
                if to_abort:
                    self._client.abort_requests(to_abort)
                for internal_id, ro, err in results:
                    if ro.finished:
                        self._not_started.discard(internal_id)
                        # observers read generation metrics; an EmbeddingRequestOutput has none
                        for obs in self.finished_observers if isinstance(ro, RequestOutput) and not err else ():
                            _notify(obs, ro)
                    q = self._queues.get(internal_id)
                    if q is not None:
                        q.put_nowait(InputError(err) if err else ro)
        except EngineDeadError as e:
            self._fail_all(e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a front-end bug must not leave callers hanging forever
            logger.exception("output loop failed")
            self._fail_all(EngineDeadError(f"the output loop failed: {type(e).__name__}: {e}"))
            self._client._mark_dead(f"the output loop failed: {type(e).__name__}: {e}")

    def _fail_all(self, error: BaseException) -> None:
        for q in self._queues.values():
            q.put_nowait(error)

    def _on_dead(self, reason: str) -> None:
        from octavo.errors import EngineDeadError

        self._fail_all(EngineDeadError(reason))
        for obs in self.dead_observers:
            try:
                obs(reason)
            except Exception:  # noqa: BLE001 - one observer must not stop the others
                logger.exception("dead observer failed")


def _notify(observer: Callable[[Any], None], value: Any) -> None:
    try:
        observer(value)
    except Exception:  # noqa: BLE001 - an observer (metrics, a plugin) must never stop the output loop
        logger.exception("observer %r failed", observer)
