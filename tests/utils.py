"""Shared test helpers: a Hugging Face safetensors copy of the embedded SmolLM2 GGUF, made once per machine.

transformers loads the GGUF (dequantized; needs ``accelerate``), drops its quantization config and saves
weights, config and tokenizer (with ``chat_template.jinja``) under ``.cache/`` in the repository
(gitignored). Later runs reuse it; creation is atomic (temp dir + rename), so parallel test processes
never see half a copy.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("OCTAVO_TEST_CACHE", REPO / ".cache"))


def run_triton_interpreted(code: str, timeout: int = 300, **env: str):
    """Run ``code`` in a child Python with ``TRITON_INTERPRET=1`` (set before any kernel is defined, so Triton
    kernels run on the CPU) and ``env`` added, from the repository root; fail with its output's tails unless it exits
    0 and prints ``ok`` last. Returns the finished process (its ``stdout`` for a test that reports it)."""
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1", **env)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                         cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-2000:] + out.stderr[-3000:]
    return out


def run_cases_interpreted(*files, timeout: int = 600, unset: tuple[str, ...] = (), quiet: bool = True,
                          need_passed: bool = True, forbid: tuple[str, ...] = ("failed",), **env: str) -> None:
    """Run the kernel-case files ``files`` in a child pytest (``-x``) with ``TRITON_INTERPRET=1`` (set before any
    kernel is defined) and ``env`` added, the switches in ``unset`` removed (the cases set them), from the repository
    root; ``quiet``: ``-W ignore``. Fails with the output's tails unless it exits 0, and, on its summary, unless it
    reports ``passed`` (``need_passed``) and none of ``forbid`` (e.g. ``skipped``: a case that could not run here)."""
    import subprocess
    import sys

    env = {k: v for k, v in dict(os.environ, TRITON_INTERPRET="1", **env).items() if k not in unset}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *(["-W", "ignore"] if quiet else []),
           *map(str, files)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert (" passed" in proc.stdout or not need_passed) and not any(w in proc.stdout for w in forbid)


def smollm2_gguf_path() -> str:
    """The embedded SmolLM2-135M-Instruct GGUF."""
    from octavo.core.loader import default_model_path

    return default_model_path()


def smollm2_safetensors_dir(dtype: str = "float32") -> Path:
    """Directory with config.json, model.safetensors and the tokenizer of SmolLM2 in ``dtype``."""
    import torch

    target = CACHE / f"smollm2-135m-instruct-{dtype}"
    if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(smollm2_gguf_path())
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype))
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.rename(tmp, target)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def tiny_llama(path: str | Path, cfg: dict):
    """Save a seeded random-weight float32 Llama of config ``cfg`` (transformers' ``LlamaConfig`` fields) to
    ``path`` and return it (same weights on every call with the same ``cfg``)."""
    import torch
    import transformers as T

    from octavo.testing.model import randomize_

    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(architectures=["LlamaForCausalLM"], **cfg)).float()
    randomize_(model)
    model.save_pretrained(path)
    return model
