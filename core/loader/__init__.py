"""Model loading: resolve a model string, read its config and tokenizer, build the model and stream weights in.

    resolved = resolve_model(settings.model)          # where, which format, which config/architecture
    tokenizer = load_tokenizer(settings.model)        # any process; GGUF tokenizers come from its metadata
    model = load_model(resolved, model_cls=cls, dtype=torch.bfloat16, device="cpu")
"""

from octavo.core.loader.resolve import (
    ResolvedModel,
    architecture_of,
    default_model_path,
    locate,
    resolve_model,
)
from octavo.core.loader.tokenizer import get_eos_token_ids, load_tokenizer

# weights.py imports torch: loaded on first use, so the front end of `octavo serve` (tokenizer only) does not
# pay for torch before it starts the engine core (docs/loading.md, "Start time")
_WEIGHTS = ("DTYPES", "get_max_model_len", "iter_weights", "load_model", "resolve_dtype")


def __getattr__(name: str):
    if name in _WEIGHTS:
        from octavo.core.loader import weights

        value = getattr(weights, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DTYPES", "ResolvedModel", "architecture_of", "default_model_path", "get_eos_token_ids", "get_max_model_len",
    "iter_weights", "load_model", "load_tokenizer", "locate", "resolve_dtype", "resolve_model",
]
