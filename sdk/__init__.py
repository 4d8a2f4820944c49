"""octavo: an LLM inference and serving engine whose chips, models and kernels are plugins.

This package is the public, stable surface. ``import octavo`` stays light: it imports neither torch nor
FastAPI nor transformers; the heavy names below load on first attribute access.

    from octavo import LLM, SamplingParams          # users
    from octavo import hookimpl, Platform           # plugin authors
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> module that defines it; resolved lazily by __getattr__ below.
_LAZY = {
    "LLM": "octavo.llm",
    "LLMEngine": "octavo.llm_engine",
    "AsyncLLM": "octavo.async_llm",
    "SamplingParams": "octavo.sampling_params",
    "RequestOutput": "octavo.outputs",
    "CompletionOutput": "octavo.outputs",
    "EmbeddingRequestOutput": "octavo.outputs",
    "EmbeddingOutput": "octavo.outputs",
    "PoolingParams": "octavo.pooling_params",
    "PoolingOutput": "octavo.pooling_outputs",
    "PoolingRequestOutput": "octavo.pooling_outputs",
    "ClassificationOutput": "octavo.pooling_outputs",
    "ClassificationRequestOutput": "octavo.pooling_outputs",
    "ScoringOutput": "octavo.pooling_outputs",
    "ScoringRequestOutput": "octavo.pooling_outputs",
    "Logprob": "octavo.outputs",
    "Platform": "octavo.platform",
    "ModelHandle": "octavo.platform",
    "PreparedModel": "octavo.platform",
    "AttentionBackend": "octavo.attention",
    "AttentionLayout": "octavo.attention",
    "ForwardContext": "octavo.model",
    "ModelProtocol": "octavo.model",
    "Quantizer": "octavo.quant",
    "Speculator": "octavo.speculator",
    "OctavoSettings": "octavo.config",
    "EngineArgs": "octavo.engine_args",
    "AsyncEngineArgs": "octavo.engine_args",
    "TextPrompt": "octavo.inputs",
    "TokensPrompt": "octavo.inputs",
}

__all__ = ["hookimpl", "__version__", *_LAZY]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs; at run time __getattr__ loads these
    from octavo.attention import AttentionBackend, AttentionLayout  # noqa: F401
    from octavo.config import OctavoSettings  # noqa: F401
    from octavo.llm import LLM  # noqa: F401
    from octavo.model import ForwardContext, ModelProtocol  # noqa: F401
    from octavo.outputs import CompletionOutput, Logprob, RequestOutput  # noqa: F401
    from octavo.platform import Platform  # noqa: F401
    from octavo.sampling_params import SamplingParams  # noqa: F401


#: loaded on first use too: importlib.metadata (the version) and pluggy cost ~0.1-0.4 s, and ``octavo serve``
#: spawns its engine core only after ``import octavo`` (issue 18 start-up)
_LAZY.update(hookimpl="octavo.hooks", __version__="octavo.version")


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'octavo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
