"""CPU stand-ins for the CUDA graphs around the LM head graphs (plugins/platforms/cuda_graph_head.py), shared by
tests/unit/test_graph_head.py (TP=1, in process) and tests/distributed/test_graph_head_tp.py (TP=2, in every ``mp``
worker through ``collective_rpc``): a "capture" keeps the function and a "replay" runs it eagerly into the
captured output, so the real ``GraphHead`` and the core's decisions (core/step_head.py) run on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from octavo.plugins.platforms.cuda_graph_head import GraphHead


class EagerGraphHead(GraphHead):
    # a capture that keeps the function and a replay that runs it into the captured output (no CUDA on the CPU)
    def _capture_one(self, size, mode, fn, arg, pool):
        out = fn(arg) if mode == "logits" else self.sampled[:size]
        self.graphs[(size, mode)] = SimpleNamespace(replay=lambda: self.outputs[(size, mode)].copy_(fn(arg)))
        self.outputs[(size, mode)] = out


class BodyRunner:
    # CUDAGraphRunner's contract on the CPU: a decode step of a captured size leaves its hidden states in that
    # size's own output buffer (the body graph's), other steps run eagerly (None)
    def __init__(self, runner):
        self.runner, self.outputs = runner, {}

    def maybe_run(self, inputs):
        n = inputs.layout.num_reqs
        if n not in self.outputs or inputs.layout.max_query_len != 1 or inputs.layout.num_tokens != n:
            return None
        self.runner.graph_runner = None  # the eager forward, then back
        try:
            hidden = self.runner.forward(inputs)
        finally:
            self.runner.graph_runner = self
        return self.outputs[n].copy_(hidden)


def install(runner, device: torch.device, sizes, setup: bool = False) -> EagerGraphHead:
    """The stand-in body graphs and a real (eager-replaying) ``GraphHead`` at ``sizes`` behind ``runner`` (a
    ``ModelRunner``), with the fused sampler as on CUDA (Triton's interpreter: ``TRITON_INTERPRET=1``).
    ``setup``: run ``GraphHead.setup`` (collective under TP: every rank at once), as ``make_graph_head`` does."""
    from octavo.plugins.platforms.cuda_sampler import sample_rows

    runner.sampler.kernel, runner.sampler.force_fused = sample_rows, True
    body = BodyRunner(runner)
    head = EagerGraphHead(runner.model, device, max(sizes))
    if setup:
        head.setup()
    with torch.inference_mode():
        for n in sizes:
            body.outputs[n] = torch.zeros(n, runner.model.config.hidden_size, device=device)
            head.capture(n, body.outputs[n], None)
    body.head = head
    runner.graph_runner = body
    return head


def install_in_worker(worker, sizes) -> dict:
    """A ``collective_rpc`` target (``"tests.distributed.graph_head_eager:install_in_worker"``): :func:`install`
    on this rank, with the TP setup; says whether greedy steps reduce vocabulary shards here."""
    head = install(worker.runner, worker.device, list(sizes), setup=True)
    return {"shard_argmax": head.shard is not None, "agrees": head.agrees}
