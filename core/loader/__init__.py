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
from octavo.core.loader.weights import DTYPES, get_max_model_len, iter_weights, load_model, resolve_dtype

__all__ = [
    "DTYPES", "ResolvedModel", "architecture_of", "default_model_path", "get_eos_token_ids", "get_max_model_len",
    "iter_weights", "load_model", "load_tokenizer", "locate", "resolve_dtype", "resolve_model",
]
