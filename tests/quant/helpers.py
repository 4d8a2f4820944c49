"""Shared helpers of the quantization tests: load a model with a quantizer and decode greedily, engine-free."""

from __future__ import annotations

import torch

from octavo.core.loader import load_model, resolve_model
from octavo.core.loader.quant import resolve_quantizer
from octavo.core.plugin_manager import get_plugin_manager
from octavo.testing.model import PagedRunner


class CPU:
    """The CPU platform as the resolver sees it (name and device type only)."""

    name = "cpu"
    device_type = "cpu"


def load(model: str, quantization: str | None, dtype=torch.float32, platform=CPU()):
    """``(model, quantizer)`` for a model path, built the way the worker builds it."""
    from octavo.config import OctavoSettings

    settings = OctavoSettings.from_kwargs(model=model)
    resolved = resolve_model(settings.model)
    pm = get_plugin_manager()
    quantizer = resolve_quantizer(quantization, resolved, platform, pm)
    cls = pm.resolve("models", resolved.architecture)
    return load_model(resolved, model_cls=cls, dtype=dtype, device="cpu", quantizer=quantizer), quantizer


def greedy(model, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy continuations of every prompt (batched) and the float32 logits of each generated position."""
    runner = PagedRunner(model, num_blocks=2 + len(prompts) * (1 + (max(map(len, prompts)) + max_tokens) // 16))
    keys = list(range(len(prompts)))
    logits = runner.step(list(zip(keys, prompts)))
    tokens: list[list[int]] = [[] for _ in prompts]
    steps: list[list[torch.Tensor]] = [[] for _ in prompts]
    for _ in range(max_tokens):
        nxt = []
        for i, lg in enumerate(logits):
            last = lg[-1]
            steps[i].append(last)
            tokens[i].append(int(last.argmax()))
            nxt.append((keys[i], [tokens[i][-1]]))
        logits = runner.step(nxt)
    return tokens, [torch.stack(s) for s in steps]


def token_logprobs(model, tokens: list[int]) -> torch.Tensor:
    """Per-token log-likelihood of ``tokens[1:]`` given the prefix (one prompt step)."""
    runner = PagedRunner(model, num_blocks=4 + len(tokens) // 16)
    logits = runner.prompts([tokens])[0]  # [n, vocab]
    logp = torch.log_softmax(logits.double(), -1)
    return logp[:-1].gather(1, torch.tensor(tokens[1:])[:, None]).squeeze(1)
