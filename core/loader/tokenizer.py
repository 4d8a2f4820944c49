"""Tokenizer loading and the token ids the engine needs from it (end of sequence, context length).

Works in any process from the model settings alone: the front end (tokenize, detokenize) and the engine
core resolve the same files. A GGUF model's tokenizer and chat template come from the GGUF metadata; the
conversion (seconds: transformers' GGUF converter rebuilds the BPE from the vocabulary and merges) runs once
per file and is cached as a saved Hugging Face tokenizer under ``$OCTAVO_CACHE_DIR`` (default
``$XDG_CACHE_HOME/octavo`` or ``~/.cache/octavo``), keyed by the SHA-256 of the GGUF file and the
transformers version, so a changed file or converter never reads a stale entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile

from octavo.core.loader.resolve import default_model_path, locate

logger = logging.getLogger(__name__)
_CACHE_FORMAT = 1  # bump when what is saved changes


def cache_root() -> str:
    """Where octavo keeps derived files: ``$OCTAVO_CACHE_DIR``, else ``$XDG_CACHE_HOME/octavo``, else
    ``~/.cache/octavo``."""
    if os.environ.get("OCTAVO_CACHE_DIR"):
        return os.environ["OCTAVO_CACHE_DIR"]
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "octavo")


def gguf_tokenizer_cache_key(path: str) -> str:
    """SHA-256 over the GGUF file's SHA-256 (``file_digest.file_sha256``), the transformers version and the cache
    format (hex)."""
    import transformers

    from octavo.core.loader.file_digest import file_sha256  # remembered by the file's identity (issue 18)

    h = hashlib.sha256()
    h.update(bytes.fromhex(file_sha256(path)))
    h.update(f"|transformers={transformers.__version__}|format={_CACHE_FORMAT}".encode())
    return h.hexdigest()


def cached_gguf_tokenizer(path: str):
    """The GGUF file's tokenizer, converted once and then loaded from the cache (see the module docstring).

    A cache that cannot be written (read-only home) only costs the conversion each time; it is logged."""
    from transformers import PreTrainedTokenizerFast

    from octavo.core.loader.gguf_file import gguf_tokenizer

    entry = os.path.join(cache_root(), "tokenizers", gguf_tokenizer_cache_key(path))
    if os.path.isfile(os.path.join(entry, "tokenizer.json")):
        return PreTrainedTokenizerFast.from_pretrained(entry)
    tokenizer = gguf_tokenizer(path)
    try:
        os.makedirs(os.path.dirname(entry), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(entry))
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, entry)  # atomic: a concurrent reader sees all of the entry or none of it
        except OSError:  # another process won the race; its entry is the same
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        logger.warning("could not cache the converted tokenizer of %s under %s (%s); it is converted again "
                       "next time. Set OCTAVO_CACHE_DIR to a writable folder.", path, entry, e)
    return tokenizer


def load_tokenizer(model_settings):
    """The Hugging Face tokenizer of ``model_settings.tokenizer`` (or of the model), or None.

    Args:
        model_settings: uses ``tokenizer``, ``model``, ``revision``, ``download_dir``, ``chat_template``,
            ``skip_tokenizer_init`` (True returns None: the engine then runs on token ids alone).

    Raises:
        ValueError: no tokenizer files where the settings point, with what was looked for and the fix.
    """
    if model_settings.skip_tokenizer_init:
        return None
    source = model_settings.tokenizer or model_settings.model or default_model_path()
    if model_settings.tokenizer and os.path.isdir(source):  # a tokenizer directory needs no config.json
        directory, gguf_file = source, None
    else:
        directory, gguf_file = locate(source, revision=model_settings.revision,
                                      download_dir=model_settings.download_dir)
    if gguf_file:
        tokenizer = cached_gguf_tokenizer(os.path.join(directory, gguf_file))
    else:
        from transformers import AutoTokenizer

        names = set(os.listdir(directory))
        if not names & {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt"}:
            raise ValueError(f"{source!r} has no tokenizer files (tokenizer.json, tokenizer_config.json, ...); pass "
                             "tokenizer=<dir or repo id>, or skip_tokenizer_init=True to run on token ids")
        tokenizer = AutoTokenizer.from_pretrained(directory)
    if model_settings.chat_template:
        tokenizer.chat_template = read_chat_template(model_settings.chat_template)
    return tokenizer


def read_chat_template(value: str) -> str:
    """``chat_template`` setting -> the template: a file's text, or the value itself when it is an inline Jinja
    template (vLLM accepts both).

    Raises:
        ValueError: neither an existing file nor Jinja text.
    """
    if os.path.isfile(value):
        with open(value) as f:
            return f.read()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"chat_template {value!r} is neither a file nor an inline Jinja template.")


def get_eos_token_ids(resolved, tokenizer=None) -> list[int]:
    """End-of-sequence ids: ``generation_config.json``'s, else the config's, else the tokenizer's."""

    def as_list(value) -> list[int]:
        if value is None:
            return []
        return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]

    gen_path = os.path.join(resolved.path, "generation_config.json")
    if not resolved.gguf_file and os.path.isfile(gen_path):
        with open(gen_path) as f:
            ids = as_list(json.load(f).get("eos_token_id"))
        if ids:
            return ids
    ids = as_list(getattr(resolved.hf_config, "eos_token_id", None))
    if not ids and tokenizer is not None:
        ids = as_list(tokenizer.eos_token_id)
    return ids
