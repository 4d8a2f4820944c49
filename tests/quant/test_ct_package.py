"""Cross-check with the reference implementation: checkpoints written by the ``compressed-tensors`` package
itself (the library llm-compressor saves with), read by octavo.

A tiny random Llama gets a preset scheme applied (``apply_quantization_config``), its scales / zero points from
the package's own ``calculate_qparams`` over min-max statistics, and is compressed and saved by
``ModelCompressor`` (``compress_model``, ``update_config``); the dense twin holds the package's own
``decompress_model`` output. octavo's tokens and logits on the compressed checkpoint must match the twin
(W8A8: the twin with int8-rounded activations; tests/quant/test_formats_int8.py). Skipped, saying so, where the
package (extra ``dev``) is not installed.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.quant.helpers import load
from tests.quant.test_formats_int8 import (
    W8A8_EMULATED_RTOL,
    W8A8_LAYER_RTOL,
    WEIGHT_ONLY_RTOL,
    _randomize,
    compare,
    emulate_w8a8,
    layerwise_error,
)

ct = pytest.importorskip("compressed_tensors", reason="the compressed-tensors package is not installed")

PRESETS = {"W8A8": None, "W4A16_ASYM": 32, "W4A16": 128, "W8A16": None}  # preset -> group size override


def _write(hf_model, preset: str, group: int | None, root: str) -> tuple[str, str, dict]:
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from safetensors.torch import save_file

    scheme = preset_name_to_scheme(preset, ["Linear"])
    if group:
        scheme.weights.group_size = group
    apply_quantization_config(hf_model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    for module in hf_model.modules():
        if hasattr(module, "weight_scale"):  # a min-max observer, as llm-compressor's default
            w, args = module.weight.data, module.quantization_scheme.weights
            if args.strategy == "group":
                blocks = w.reshape(w.shape[0], -1, args.group_size)
                lo, hi = blocks.amin(-1), blocks.amax(-1)
            else:
                lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
            scale, zero = calculate_qparams(lo, hi, args)
            module.weight_scale.data = scale.reshape(module.weight_scale.shape).to(module.weight_scale.dtype)
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data = zero.reshape(module.weight_zero_point.shape).to(
                    module.weight_zero_point.dtype)
    compressor = ModelCompressor.from_pretrained_model(hf_model)
    compressor.compress_model(hf_model)
    qdir, ddir = os.path.join(root, preset), os.path.join(root, f"{preset}-dense")
    hf_model.save_pretrained(qdir)
    compressor.update_config(qdir)
    compressor.decompress_model(hf_model)
    dense = {k: v.detach().float().clone().contiguous() for k, v in hf_model.state_dict().items()
             if k.rpartition(".")[2] not in ("weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")}
    os.makedirs(ddir)
    with open(os.path.join(qdir, "config.json")) as f:
        config = json.load(f)
    quant_config = config.pop("quantization_config")
    with open(os.path.join(ddir, "config.json"), "w") as f:
        json.dump(config, f)
    save_file(dense, os.path.join(ddir, "model.safetensors"))
    return qdir, ddir, quant_config


@pytest.mark.parametrize("preset", list(PRESETS))
def test_package_written_checkpoint(preset, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    hf_model = _randomize(LlamaForCausalLM(config))
    qdir, ddir, quant_config = _write(hf_model, preset, PRESETS[preset], str(tmp_path))
    quantized, quantizer = load(qdir, None)
    assert quantizer.name == "compressed-tensors", quant_config
    dense = load(ddir, None)[0]
    w8a8 = quant_config["config_groups"]["group_0"].get("input_activations") is not None
    reference = emulate_w8a8(dense, None) if w8a8 else dense
    worst = compare(preset, quantized, reference, W8A8_EMULATED_RTOL if w8a8 else WEIGHT_ONLY_RTOL)
    print(f"{preset} ({quant_config['format']}): worst logit difference {worst:.5%}")
    assert worst < (W8A8_EMULATED_RTOL if w8a8 else WEIGHT_ONLY_RTOL)
    if w8a8:
        assert layerwise_error(quantized, reference, [1, 17, 93, 250, 7]) < W8A8_LAYER_RTOL
