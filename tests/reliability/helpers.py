"""Helpers shared by the reliability tests (the fixtures are in conftest.py)."""

from __future__ import annotations

import os

import httpx

FULL = os.environ.get("OCTAVO_RELIABILITY", "").lower() == "full"
SERVER_ARGS = ["--max-model-len", "512", "--max-num-seqs", "16", "--shutdown-timeout", "6"]


def scale(bounded: int, full: int) -> int:
    return full if FULL else bounded


def tracebacks(server) -> int:
    """Tracebacks the server has logged so far (each genuine 5xx logs one; nothing else should)."""
    return server.log_file.read_text(errors="replace").count("Traceback (most recent call last)")


def assert_openai_error(resp: httpx.Response) -> dict:
    """The body is ``{"error": {message, type, param, code}}`` with no traceback or internal class name."""
    body = resp.json()
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}, body
    assert isinstance(err["message"], str) and err["message"], body
    for leak in ("Traceback", "SamplingParams", "File \"", "octavo.core", "InputError", "ValidationError"):
        assert leak not in err["message"], body
    return err
