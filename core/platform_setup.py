"""The one place the core hands a loaded model to its platform: build the typed :class:`ModelHandle`, call
``Platform.prepare_model``, install what comes back (a step runner the model runner asks first each step).

The platform sees the handle's fields only (model, device, dtype, backend class, block size, limits) and
returns a :class:`PreparedModel`; it never reads or writes the worker, so the worker's attributes are not
an API.
"""

from __future__ import annotations

import logging
from typing import Any

from octavo.core.spec_verify import verify_graph_shapes
from octavo.errors import PluginError
from octavo.platform import ModelHandle, PreparedModel

logger = logging.getLogger(__name__)


def prepare_on_platform(worker: Any) -> PreparedModel:
    """Let ``worker.platform`` prepare the loaded model; install its step runner on ``worker.runner``."""
    settings = worker.settings
    handle = ModelHandle(
        model=worker.model, device=worker.device, dtype=worker.dtype, attn_backend=worker.attn_backend_cls,
        block_size=worker.block_size, max_model_len=worker.max_model_len,
        max_num_seqs=settings.scheduler.max_num_seqs,
        max_num_batched_tokens=settings.scheduler.max_num_batched_tokens or max(2048, worker.max_model_len),
        enforce_eager=settings.device.enforce_eager, spec_verify_shapes=verify_graph_shapes(settings))
    prepared = worker.platform.prepare_model(handle)
    if prepared is None:
        return PreparedModel()
    if not isinstance(prepared, PreparedModel):
        raise PluginError(f"platform {worker.platform.name!r}: prepare_model returned {type(prepared).__name__}; "
                          "return an octavo.platform.PreparedModel or None.")
    if prepared.step_runner is not None:
        if not callable(getattr(prepared.step_runner, "maybe_run", None)):
            raise PluginError(f"platform {worker.platform.name!r}: the step runner it returned has no "
                              "maybe_run(inputs) method.")
        worker.runner.graph_runner = prepared.step_runner
    if prepared.notes:
        logger.info("platform %s prepared the model: %s", worker.platform.name, prepared.notes)
    return prepared
