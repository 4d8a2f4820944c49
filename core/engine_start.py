"""What the engine says once it is built: one log line naming every choice that decides speed and output
(platform, attention backend, dtype, quantization, KV cache size), and the same facts to
``octavo_on_engine_start`` plugins. Choices made silently are the hardest to debug (an always-available
third-party platform quietly winning selection, a backend fallback), so none is left out.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("octavo.engine")


def announce_engine_start(pm: Any, settings: Any, platform: Any, info: Any) -> None:
    """Log the engine's choices and call ``octavo_on_engine_start`` with them.

    Args:
        pm: the plugin manager.
        settings: the engine's settings.
        platform: the selected :class:`octavo.Platform` instance.
        info: the executor's ``WorkerInfo`` (dtype, attention backend, quantization, cache geometry).
    """
    # NOTE: WorkerInfo.quantization is read with getattr so an executor built before the field existed still
    # starts; tests/plugins/test_builtin_copy.py checks that the real value ("gguf" for SmolLM2) arrives.
    quantization = getattr(info, "quantization", None)
    facts = dict(platform=platform.name, attention_backend=info.attention_backend, dtype=info.dtype,
                 quantization=quantization, num_kv_blocks=info.num_blocks, block_size=info.block_size)
    logger.info("engine start: platform %s (%s), attention backend %s, dtype %s, quantization %s, KV cache %d "
                "blocks x %d tokens = %d tokens", platform.name, info.device, info.attention_backend or "none",
                info.dtype, quantization or "none", info.num_blocks, info.block_size,
                info.num_blocks * info.block_size)
    pm.hook.octavo_on_engine_start(settings=settings, **facts)
