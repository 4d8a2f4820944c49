"""The 8-bit and asymmetric formats pass ``octavo.testing.QuantizerContract``: each linear method (plain, fused
and long-input layers) against a float64 dense reference on the dequantized weights, CPU (and CUDA, marked)."""

from __future__ import annotations

from octavo.plugins.quant.compressed_tensors import CompressedTensorsQuantizer
from octavo.plugins.quant.gptq_awq import GPTQQuantizer
from octavo.testing import QuantizerContract
from tests.quant.formats_int8 import (
    ct_w4a16_asym_tensors,
    ct_w8a8_tensors,
    ct_w8a16_asym_tensors,
    gptq8_tensors,
    w4a16_asym_config,
    w8a8_config,
    w8a16_asym_config,
)

# weight-only: fp32 kernels on the exact weights (CPU ~1e-6; the CUDA kernels take bf16 activations)
WEIGHT_ONLY_REL_ERROR = 0.015
# W8A8 rounds the activations to int8 too (the reference does not): measured 0.5-0.8% dynamic per token,
# ~1% static per tensor (x ~ N(0, 1), input_scale = 4.5 / 127.5)
W8A8_REL_ERROR = 0.025


class TestCompressedTensorsW8A8Dynamic(QuantizerContract):
    quantizer_cls, config, rel_error = CompressedTensorsQuantizer, w8a8_config(), W8A8_REL_ERROR

    def make_checkpoint(self, weight):
        return ct_w8a8_tensors(weight)


class TestCompressedTensorsW8A8Static(QuantizerContract):
    quantizer_cls, config, rel_error = CompressedTensorsQuantizer, w8a8_config(dynamic=False), W8A8_REL_ERROR

    def make_checkpoint(self, weight):
        return ct_w8a8_tensors(weight, per_tensor=True, input_scale=4.5 / 127.5)


class TestCompressedTensorsW4A16Asym(QuantizerContract):
    quantizer_cls, config, rel_error = CompressedTensorsQuantizer, w4a16_asym_config(32), WEIGHT_ONLY_REL_ERROR

    def make_checkpoint(self, weight):
        return ct_w4a16_asym_tensors(weight, 32)


class TestCompressedTensorsW8A16Asym(QuantizerContract):
    quantizer_cls, config, rel_error = CompressedTensorsQuantizer, w8a16_asym_config(128), WEIGHT_ONLY_REL_ERROR

    def make_checkpoint(self, weight):
        return ct_w8a16_asym_tensors(weight, 128)


class TestCompressedTensorsFP8(QuantizerContract):
    """float-quantized FP8 W8A8 on the fp8 method (CUDA with FP8 tensor cores; the CPU variant skips, saying so)."""

    quantizer_cls, rel_error = CompressedTensorsQuantizer, 0.05  # e4m3 activations: 3 mantissa bits (as fp8's)
    config = w8a8_config()
    config["format"] = "float-quantized"
    config["config_groups"]["group_0"]["weights"]["type"] = "float"
    config["config_groups"]["group_0"]["input_activations"]["type"] = "float"

    def make_checkpoint(self, weight):
        from octavo.plugins.quant.fp8 import quantize_fp8_rows

        q, s = quantize_fp8_rows(weight)
        return {"weight": q, "weight_scale": s[:, None]}, q.float() * s[:, None]


class TestGPTQ8DescAct(QuantizerContract):
    quantizer_cls, rel_error = GPTQQuantizer, WEIGHT_ONLY_REL_ERROR
    config = {"quant_method": "gptq", "bits": 8, "group_size": 32, "sym": False, "desc_act": True}

    def make_checkpoint(self, weight):  # one permutation per input size: fused parts share it, as in GPTQ
        return gptq8_tensors(weight, 32, False, True, seed=weight.shape[1])
