"""Cancel a non-streaming request when its client goes away, so the engine stops working for nobody.

Used by the generation routes (``app.py``) and ``/v1/responses`` (``responses.py``); its own module because
``app`` registers ``responses``' routes (importing from ``app`` there would be an import circle).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from fastapi.responses import Response


async def until_disconnect(request: Request, coro: Any, stream: bool) -> Any:
    """Run a non-streaming request, cancelling it (which aborts it in the engine) if the client leaves: 499.

    Streaming responses need no watcher: Starlette cancels the body iterator when the client goes away.
    """
    if stream:
        return await coro
    task = asyncio.ensure_future(coro)

    async def wait_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()  # the client left: the generator's finally aborts the request
        try:
            await task
        except asyncio.CancelledError:
            pass
        return Response(status_code=499)
    return task.result()
