"""Inputs shared by the fp8 GEMV tests (test_fp8_gemv.py: CUDA-core kernel; test_fp8_gemv_tc.py: tensor-core kernel).

Why one module: both kernels compute the same W8A8 product and are checked on the same kinds of input against
fp8_gemv.fp8_gemv_reference (float64), so the shapes, the row scaling (rows spanning 1e-2..1e1, a zero row), the
bias and the tolerance are written once. Importable from the tests' interpreter child processes (run with the
repository root as the working directory).
"""

from __future__ import annotations

import pytest
import torch

# the fp8 kernel tests' two runs: the Triton interpreter on a CPU machine, the compiled kernel on a GPU one
interpreter_only = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="interpreter check for CPU machines; on a GPU the compiled kernel is tested")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# (rows, N, K, bias): odd sizes, K over several blocks, a bias; rows up to the kernels' 16
CPU_CASES = [(1, 40, 200, False), (3, 33, 130, True), (2, 17, 64, False), (9, 20, 100, False), (16, 17, 64, False)]
LLAMA3_8B_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # qkv, o, gate_up, down



def assert_each_refused(calls) -> None:
    """Each of ``calls`` raises ValueError (a bad argument refused before any launch)."""
    for bad in calls:
        try:
            bad()
        except ValueError:
            continue
        raise AssertionError("accepted")

def gemv_case(gen: torch.Generator, m: int, n: int, k: int, bias: bool, device: str = "cpu"):
    """``(w e4m3 [n, k], per-row scales, x bf16 [m, k], bias or None)``; rows scaled 1e-2..1e1, row 1 of 3 zero."""
    from octavo.plugins.quant.fp8 import quantize_fp8_rows

    w, ws = quantize_fp8_rows(torch.randn(n, k, generator=gen, device=device))
    x = (torch.randn(m, k, generator=gen, device=device)
         * torch.logspace(-2, 1, m, device=device)[:, None]).bfloat16()
    if m == 3:
        x[1] = 0
    b = torch.randn(n, generator=gen, device=device).bfloat16() if bias else None
    return w, ws, x, b


def fp32_tolerance(ref: torch.Tensor, b: torch.Tensor | None) -> float:
    """Bound on |fp32 kernel output - float64 reference|: fp32 summation of exact e4m3 products, plus one bf16
    rounding of the bias sum (torch adds the bias to the rounded product)."""
    return 1e-6 * float(ref.abs().max()) + (2e-2 * float(b.abs().max()) if b is not None else 0.0)


def cpu_fp8_linear(gen: torch.Generator, in_features: int = 96, out_features: int = 48):
    """``(method, layer)``: an fp8 linear method over a random dense weight, processed as the loader does (on CPU
    tensors it picks no GEMV; the tests set the path by hand)."""
    from octavo.plugins.quant.fp8 import _FP8Method

    method = _FP8Method(prequantized=False)
    layer = torch.nn.Module()
    method.create_weights(layer, in_features, [out_features], torch.bfloat16)
    layer.bias = None
    for name, value in method.convert({"weight": torch.randn(out_features, in_features, generator=gen)},
                                      "t").items():
        getattr(layer, name).data.copy_(value)
    method.process_weights_after_loading(layer)
    return method, layer


def assert_graph_replays_match(block, plain, x: torch.Tensor, inputs) -> None:
    """Capture ``block()`` (a tuple of tensors) in a CUDA graph; for each of ``inputs`` copied into ``x`` (the
    graph's input buffer) the replayed outputs must equal ``plain()`` (the same computation run eagerly without
    the launch feature under test) bit for bit: the graph reads each new input, never a stale one."""
    block()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = block()
    for i, src in enumerate(inputs):
        x.copy_(src)
        graph.replay()
        for got, ref in zip(outs, plain()):
            assert torch.equal(got, ref), i

