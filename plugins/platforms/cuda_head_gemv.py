"""The LM head's one-row GEMM through the body's Triton GEMV (``OCTAVO_HEAD_GEMV``, default on; issue 17 / issue 9).

Why: at batch 1 the Llama-3-8B LM head reads 1.05 GB per token through ``F.linear`` (cuBLAS), outside the body's
tuned GEMV (cuda_fusions.gemv, ~2.8-3 TB/s on the body's shapes). This gives the head a ``logits_method`` whose
one-row path is that GEMV (bf16 out, as ``F.linear``; ``compute_logits`` casts to float32 as before); more rows, a
bias or a switched-off method run what ran before (the previous method, e.g. cuda_gemm's ``LogitsMethod``, or
``F.linear``). Eager and captured heads (cuda_graph_head.py) call the same method, so they agree bit for bit; the
GEMV's summation order differs from cuBLAS's (checked at install within one bf16 rounding step, as the body's).

Measured (s9 batch 1, 2x H200, one engine each, 4 alternating rounds per mode, ``benchmarks/graph_head_ab.py
--gemv-ab``): 8B fp8 batch 1 3.157 -> 3.011 ms/token (cuBLAS -> GEMV; the GEMM alone 0.250 -> 0.234 ms), 8B bf16
4.197 -> 4.202 (no change), the TP=2 shard GEMM alone 0.133 -> 0.119 ms. ``OCTAVO_HEAD_GEMV=0``: cuBLAS.
"""

from __future__ import annotations

import logging

import torch

from octavo.env_flags import env_switch

logger = logging.getLogger(__name__)


class HeadGemvMethod:
    """``ParallelLMHead.logits_method``: one row -> :func:`cuda_fusions.gemv`, else ``inner`` (or ``F.linear``)."""

    def __init__(self, inner=None) -> None:
        self.inner = inner
        self.enabled = True  # benchmarks switch it (graph_head_ab.py: head graphs re-captured after)

    def apply(self, layer, x: torch.Tensor, bias=None) -> torch.Tensor:
        if self.enabled and bias is None and x.dim() == 2 and x.shape[0] == 1 and layer.weight.stride(1) == 1:
            from octavo.plugins.platforms.cuda_fusions import gemv

            return gemv(x, layer.weight)
        if self.inner is not None:
            return self.inner.apply(layer, x, bias)
        return torch.nn.functional.linear(x, layer.weight, bias)

    def process_weights_after_loading(self, layer) -> None:
        pass


@torch.inference_mode()
def install_head_gemv(model, dtype: torch.dtype, device: torch.device) -> dict[str, int]:
    """Give each dense 16-bit ``ParallelLMHead`` of ``model`` (no logits method, or cuda_gemm's) a
    :class:`HeadGemvMethod` (unless ``OCTAVO_HEAD_GEMV=0``) where the GEMV matches ``F.linear`` on a random row."""
    if not env_switch("OCTAVO_HEAD_GEMV", default=True) or dtype not in (torch.bfloat16, torch.float16):
        return {}
    from octavo.nn.embedding import ParallelLMHead
    from octavo.plugins.platforms.cuda_fusions import _close, gemv
    from octavo.plugins.platforms.cuda_gemm import LogitsMethod

    gen = torch.Generator(device=device).manual_seed(0)
    n = 0
    for m in model.modules():
        if not isinstance(m, ParallelLMHead) or m.bias is not None or m.weight.dtype != dtype \
                or not (m.logits_method is None or isinstance(m.logits_method, LogitsMethod)):
            continue
        x = torch.randn(1, m.weight.shape[1], generator=gen, device=device, dtype=torch.float32).to(dtype)
        if not _close(gemv(x, m.weight), torch.nn.functional.linear(x, m.weight)):
            logger.warning("LM head GEMV does not match F.linear for %s; cuBLAS kept", tuple(m.weight.shape))
            continue
        m.logits_method = HeadGemvMethod(m.logits_method)
        n += 1
    return {"LMHead(gemv)": n} if n else {}


def set_head_gemv(worker, on: bool) -> dict:
    """A ``collective_rpc`` target: switch this rank's head GEMV and re-capture its head graphs (every rank at
    once under TP: the captures' warm-ups run the head's all-gather)."""
    head = getattr(worker.model, "lm_head", None)
    method = getattr(head, "logits_method", None)
    if not isinstance(method, HeadGemvMethod):
        return {"installed": False}
    method.enabled = bool(on)
    graph_head = getattr(getattr(worker.runner, "graph_runner", None), "head", None)
    recaptured = []
    if graph_head is not None:
        for size in sorted(graph_head.body_outputs, reverse=True):
            graph_head.capture(size, graph_head.body_outputs[size], worker.runner.graph_runner.pool)
            recaptured.append(size)
    torch.cuda.synchronize(worker.device)
    return {"installed": True, "enabled": method.enabled, "recaptured": recaptured}
