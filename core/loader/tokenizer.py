"""Tokenizer loading and the token ids the engine needs from it (end of sequence, context length).

Works in any process from the model settings alone: the front end (tokenize, detokenize) and the engine
core resolve the same files. A GGUF model's tokenizer and chat template come from the GGUF metadata.
"""

from __future__ import annotations

import json
import os

from octavo.core.loader.resolve import default_model_path, locate


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
    directory, gguf_file = locate(source, revision=model_settings.revision, download_dir=model_settings.download_dir)
    if gguf_file:
        from octavo.core.loader.gguf_file import gguf_tokenizer

        tokenizer = gguf_tokenizer(os.path.join(directory, gguf_file))
    else:
        from transformers import AutoTokenizer

        names = set(os.listdir(directory))
        if not names & {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt"}:
            raise ValueError(f"{source!r} has no tokenizer files (tokenizer.json, tokenizer_config.json, ...); pass "
                             "tokenizer=<dir or repo id>, or skip_tokenizer_init=True to run on token ids")
        tokenizer = AutoTokenizer.from_pretrained(directory)
    if model_settings.chat_template:
        with open(model_settings.chat_template) as f:
            tokenizer.chat_template = f.read()
    return tokenizer


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
