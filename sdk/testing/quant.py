"""``QuantizerContract``: the pytest suite every quantizer plugin passes.

A quantizer's linear method, built into a real ``octavo.nn`` layer (plain, fused ``qkv``-style and
row-parallel shapes), loaded from the tensors the quantizer's own ``make_checkpoint`` writes, must compute
``x @ W^T + b`` within its documented error of a float64 dense reference computed from the *dequantized*
weights. CPU always; CUDA when a GPU is present and the quantizer supports it (tests marked ``gpu``).

    from octavo.testing import QuantizerContract

    class TestMyQuant(QuantizerContract):
        quantizer_cls = MyQuantizer
        config = {"quant_method": "my", "bits": 4}
        rel_error = 0.01                 # documented error bound: max |y - y_ref| / max |y_ref|

        def make_checkpoint(self, weight):   # dense [N, K] -> (on-disk tensors, dequantized [N, K])
            ...
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from octavo.platform import Availability


class _Device:
    def __init__(self, device_type: str) -> None:
        self.name = self.device_type = device_type


class QuantizerContract:
    """Subclass and set ``quantizer_cls``, ``config``, ``rel_error`` and ``make_checkpoint``."""

    quantizer_cls: ClassVar[type]
    config: ClassVar[dict[str, Any]] = {}
    rel_error: ClassVar[float] = 0.01
    #: (input size, output sizes of the fused parts): plain, fused, and a long-input (down_proj-like) layer
    shapes: ClassVar[list[tuple[int, list[int]]]] = [(256, [384]), (256, [256, 128, 128]), (512, [256])]

    def make_checkpoint(self, weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The on-disk tensors (suffix -> tensor) of one projection, and the weight they dequantize to."""
        return {"weight": weight}, weight

    def _quantizer(self):
        return self.quantizer_cls.from_config(dict(self.config))

    def _layer(self, device: str, input_size: int, output_sizes: list[int], seed: int = 0):
        """A layer built under the quantizer's scope, loaded part by part; and its dequantized dense weight."""
        from octavo.nn import MergedColumnParallelLinear, ReplicatedLinear
        from octavo.quant import quantization_scope

        quantizer = self._quantizer()
        gen = torch.Generator().manual_seed(seed)
        mapping = {"fused_proj": [f"part{i}" for i in range(len(output_sizes))]}
        with torch.device(device), quantization_scope(quantizer, mapping) as methods:
            if len(output_sizes) == 1:
                layer = ReplicatedLinear(input_size, output_sizes[0], bias=True, prefix="layer.proj")
            else:
                layer = MergedColumnParallelLinear(input_size, output_sizes, bias=True, prefix="layer.fused_proj")
        assert methods, f"{self.quantizer_cls.__name__} gave no linear method to a plain linear layer"
        dense_parts, stream = [], []
        for i, size in enumerate(output_sizes):
            module = "layer.proj" if len(output_sizes) == 1 else f"layer.part{i}"
            tensors, dense = self.make_checkpoint(torch.randn(size, input_size, generator=gen) * 0.05)
            dense_parts.append(dense.double())
            stream += [(f"{module}.{s}", t) for s, t in tensors.items()]
        params = dict(layer.named_parameters())
        for name, tensor in quantizer.adapt_weights(stream, methods):
            module, _, suffix = name.rpartition(".")
            param = params[suffix]
            shard = None if len(output_sizes) == 1 else int(module.rpartition("part")[2])
            param.weight_loader(param, tensor.to(device), shard) if shard is not None else \
                param.weight_loader(param, tensor.to(device))
        bias = torch.randn(sum(output_sizes), generator=gen) * 0.1
        layer.bias.data.copy_(bias)
        layer.process_weights_after_loading()
        return layer, torch.cat(dense_parts), bias.double()

    def _check(self, device: str, dtype: torch.dtype) -> None:
        for input_size, output_sizes in self.shapes:
            layer, weight, bias = self._layer(device, input_size, output_sizes)
            x = torch.randn(7, input_size, generator=torch.Generator().manual_seed(1))
            want = x.double() @ weight.t() + bias  # [7, N] float64 reference on the dequantized weights
            got = layer(x.to(device, dtype)).double().cpu()
            err = float((got - want).abs().max() / want.abs().max())
            assert err <= self.rel_error, (f"{self.quantizer_cls.__name__} {input_size}->{output_sizes} on {device} "
                                           f"({dtype}): relative error {err:.4f} > documented {self.rel_error}")

    def test_supports_answers_with_availability(self):
        for device_type in ("cpu", "cuda"):
            answer = self._quantizer().supports(_Device(device_type))
            assert isinstance(answer, Availability)
            assert answer or answer.reason, "an unsupported platform needs a reason"

    def test_linear_method_matches_float64_reference_cpu(self):
        if not self._quantizer().supports(_Device("cpu")):
            pytest.skip(f"{self.quantizer_cls.__name__} does not run on CPU")
        self._check("cpu", torch.float32)

    @pytest.mark.gpu
    def test_linear_method_matches_float64_reference_cuda(self):
        if not torch.cuda.is_available():
            pytest.skip("no CUDA GPU")
        if not self._quantizer().supports(_Device("cuda")):
            pytest.skip(f"{self.quantizer_cls.__name__} does not run on CUDA")
        self._check("cuda", torch.bfloat16)
