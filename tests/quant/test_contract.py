"""The built-in quantizers pass ``octavo.testing.QuantizerContract`` (linear method vs a float64 dense
reference on the dequantized weights, within each method's documented error: docs/quantization.md)."""

from __future__ import annotations

import numpy as np
import torch

from octavo.plugins.quant.compressed_tensors import CompressedTensorsQuantizer
from octavo.plugins.quant.fp8 import FP8Quantizer, quantize_fp8_rows
from octavo.plugins.quant.gguf import GGUFQuantizer, blocks_to_float
from octavo.plugins.quant.gptq_awq import AWQQuantizer, GPTQQuantizer
from octavo.plugins.quant.kernels import dequantize_int4, quantize_int4, quantize_int8
from octavo.plugins.quant.weight_only import Int4Quantizer, Int8Quantizer
from octavo.quant import GGUFBlocks
from octavo.testing import QuantizerContract
from tests.quant.formats import awq_tensors, compressed_w4a16_tensors, gptq_tensors

# bf16 activations, bf16 scales and a bf16 output: ~0.5% of the output range, bounded here at 1.5%
INT_REL_ERROR = 0.015


class TestInt8(QuantizerContract):
    quantizer_cls, config, rel_error = Int8Quantizer, {"quant_method": "int8"}, INT_REL_ERROR

    def make_checkpoint(self, weight):
        q, s = quantize_int8(weight)
        return {"weight": weight}, q.float() * s[:, None]


class TestInt4(QuantizerContract):
    quantizer_cls, config, rel_error = Int4Quantizer, {"quant_method": "int4", "group_size": 64}, INT_REL_ERROR

    def make_checkpoint(self, weight):
        return {"weight": weight}, dequantize_int4(*quantize_int4(weight, 64))


class TestGPTQDescAct(QuantizerContract):
    quantizer_cls, rel_error = GPTQQuantizer, INT_REL_ERROR
    config = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, "desc_act": True}

    def make_checkpoint(self, weight):  # one permutation per input size: fused parts share it, as in GPTQ
        return gptq_tensors(weight, 32, False, True, seed=weight.shape[1])


class TestAWQ(QuantizerContract):
    quantizer_cls, rel_error = AWQQuantizer, INT_REL_ERROR
    config = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}

    def make_checkpoint(self, weight):
        return awq_tensors(weight, 128)


class TestCompressedTensorsW4A16(QuantizerContract):
    quantizer_cls, rel_error = CompressedTensorsQuantizer, INT_REL_ERROR
    config = {"quant_method": "compressed-tensors", "format": "pack-quantized",
              "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                  "strategy": "group", "group_size": 128},
                                      "input_activations": None}}}

    def make_checkpoint(self, weight):
        return compressed_w4a16_tensors(weight, 128)


class TestGGUFQ4_1(QuantizerContract):
    quantizer_cls, rel_error = GGUFQuantizer, INT_REL_ERROR
    ggml_type = 3  # Q4_1 -> int4, exact repack
    config = {"quant_method": "gguf", "tensor_types": {}}

    def _quantizer(self):
        types = {"layer.proj": self.ggml_type, **{f"layer.part{i}": self.ggml_type for i in range(3)}}
        return GGUFQuantizer(types)

    def make_checkpoint(self, weight):
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        blocks = GGUFBlocks(torch.from_numpy(quantize(weight.numpy().astype(np.float32),
                                                      GGMLQuantizationType(self.ggml_type))),
                            self.ggml_type, tuple(weight.shape))
        return {"weight": blocks}, blocks_to_float(blocks)


class TestGGUFQ5_0(TestGGUFQ4_1):
    ggml_type = 6  # Q5_0 -> int8 rows: one more rounding, relative to the Q5_0 values
    rel_error = 0.02


class TestFP8(QuantizerContract):
    quantizer_cls, config, rel_error = FP8Quantizer, {"quant_method": "fp8"}, 0.05  # e4m3 activations: 3 bits

    def make_checkpoint(self, weight):
        q, s = quantize_fp8_rows(weight)
        return {"weight": weight}, q.float() * s[:, None]
