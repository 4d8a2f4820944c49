"""What the compressed-tensors and GPTQ readers still refuse: each fails at start with the field named."""

from __future__ import annotations

import copy
import json
import os

import pytest

from octavo.core.loader import resolve_model
from octavo.core.loader.quant import resolve_quantizer
from octavo.core.plugin_manager import get_plugin_manager
from octavo.plugins.quant.compressed_tensors import CompressedTensorsQuantizer
from octavo.plugins.quant.gptq_awq import GPTQQuantizer
from tests.quant.formats_int8 import w4a16_asym_config, w8a8_config
from tests.quant.helpers import CPU


def _w8a8(**changes):
    config = copy.deepcopy(w8a8_config())
    group = config["config_groups"]["group_0"]
    for path, value in changes.items():
        section, _, key = path.partition("__")
        if key:
            group[section][key] = value
        else:
            config[section] = value
    return config


REFUSED = {  # config -> text the error must contain
    "asymmetric W8A8 weights": (_w8a8(weights__symmetric=False), "symmetric=False"),
    "group-wise W8A8 weights": (_w8a8(weights__strategy="group", weights__group_size=128), "strategy='group'"),
    "4-bit weights with int8 activations (W4A8)": (_w8a8(weights__num_bits=4), "num_bits=4"),
    "int weights in the FP8 format": (_w8a8(format="float-quantized"), "float-quantized"),
    "mixed-precision format": (_w8a8(format="mixed-precision"), "mixed-precision"),
    "FP8 weights in an int format": (_w8a8(weights__type="float"), "FP8 scheme format='int-quantized'"),
    "FP4 weights": (_w8a8(weights__type="float", weights__num_bits=4), "type='float', num_bits=4"),
    "static FP8 activations": (_w8a8(format="float-quantized", weights__type="float", input_activations__type="float",
                                     input_activations__strategy="tensor", input_activations__dynamic=False),
                               "static FP8 activation scales"),
    "group activations": (_w8a8(input_activations__strategy="group"), "strategy='group'"),
    "dynamic static-tensor mismatch": (_w8a8(input_activations__dynamic="local"), "dynamic='local'"),
    "int8 kv cache scheme": (_w8a8(kv_cache_scheme={"num_bits": 8, "type": "int", "strategy": "tensor"}),
                             "kv_cache_scheme"),
    "per-head kv cache scales": (_w8a8(kv_cache_scheme={"num_bits": 8, "type": "float", "strategy": "attn_head"}),
                                 "kv_cache_scheme"),
    "two config groups": (dict(w8a8_config(), config_groups={"a": {}, "b": {}}), "2 config groups"),
    "not saved compressed": (_w8a8(quantization_status="frozen"), "quantization_status='frozen'"),
    "actorder group (weight_g_idx)": (
        (lambda c: (c["config_groups"]["group_0"]["weights"].update(actorder="group"), c)[1])(w4a16_asym_config(128)),
        "actorder='group'"),
    "3-bit weights": ((lambda c: (c["config_groups"]["group_0"]["weights"].update(num_bits=3), c)[1])(
        w4a16_asym_config(128)), "num_bits=3"),
    "4-bit group 48": ((lambda c: (c["config_groups"]["group_0"]["weights"].update(group_size=48), c)[1])(
        w4a16_asym_config(128)), "group_size=48"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_compressed_tensors_refuses(case):
    config, text = REFUSED[case]
    with pytest.raises(ValueError) as info:
        CompressedTensorsQuantizer.from_config(config)
    assert text in str(info.value) and "compressed-tensors" in str(info.value), str(info.value)


@pytest.mark.parametrize("bits,group,text", [(3, 128, "bits=3"), (2, 128, "bits=2"), (8, 48, "group_size=48")])
def test_gptq_refuses(bits, group, text):
    with pytest.raises(ValueError, match=text):
        GPTQQuantizer.from_config({"quant_method": "gptq", "bits": bits, "group_size": group})


def test_half_ignored_fused_layer_is_refused():
    quantizer = CompressedTensorsQuantizer.from_config(
        dict(w8a8_config(), ignore=["model.layers.0.self_attn.k_proj"]))
    quantizer.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    with pytest.raises(ValueError, match="all or nothing"):
        quantizer.get_linear_method("model.layers.0.self_attn.qkv_proj")
    assert quantizer.get_linear_method("model.layers.1.self_attn.qkv_proj") is not None
    quantizer.ignore = ["re:.*self_attn\\.[qkv]_proj$"]
    assert quantizer.get_linear_method("model.layers.0.self_attn.qkv_proj") is None


def test_fp8_scheme_runs_only_where_fp8_matmuls_do():
    """compressed-tensors FP8 W8A8 is read (the fp8 method), but a CPU cannot run it: refused, saying why."""
    from octavo.plugins.quant.fp8 import _FP8Method

    config = _w8a8(format="float-quantized", weights__type="float", input_activations__type="float")
    quantizer = CompressedTensorsQuantizer.from_config(config)
    quantizer.packed_modules_mapping = {}
    assert isinstance(quantizer.get_linear_method("model.layers.0.mlp.down_proj"), _FP8Method)
    answer = quantizer.supports(CPU())
    assert not answer and "FP8" in answer.reason and "cuda" in answer.reason


def test_refused_at_start_through_the_resolver(tmp_path):
    """The refusal comes from resolving the checkpoint (before any weight is read), naming the field."""
    from transformers import LlamaConfig

    from octavo.config import OctavoSettings

    LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(tmp_path)
    with open(os.path.join(tmp_path, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = _w8a8(format="float-quantized")
    with open(os.path.join(tmp_path, "config.json"), "w") as f:
        json.dump(config, f)
    resolved = resolve_model(OctavoSettings.from_kwargs(model=str(tmp_path), load_format="dummy").model)
    with pytest.raises(ValueError, match="float-quantized"):
        resolve_quantizer(None, resolved, CPU(), get_plugin_manager())


def test_fp8_kv_cache_scheme_scales_reach_the_attention_layers(tmp_path):
    """An FP8 ``kv_cache_scheme`` is read: its per-layer ``k_scale`` / ``v_scale`` land on the attention layers
    (used by ``kv_cache_dtype="fp8"``, docs/quantization.md "FP8 KV cache")."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.quant.formats import write_checkpoints
    from tests.quant.formats_int8 import ct_w8a8_tensors
    from tests.quant.helpers import load

    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1)
    quant_config = dict(w8a8_config(), kv_cache_scheme={"num_bits": 8, "type": "float", "strategy": "tensor",
                                                        "dynamic": False, "symmetric": True})
    qdir, _ = write_checkpoints(LlamaForCausalLM(config), str(tmp_path), "kv", quant_config,
                                lambda w, i: ct_w8a8_tensors(w))
    path = os.path.join(qdir, "model.safetensors")
    state = load_file(path)
    for layer in range(2):
        state[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(0.5 + layer)
        state[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(0.25 + layer)
    save_file(state, path)
    model, quantizer = load(qdir, None)
    assert quantizer.name == "compressed-tensors"
    scales = sorted(m.kv_scales for m in model.modules() if hasattr(m, "kv_scales"))
    assert scales == [(0.5, 0.25), (1.5, 1.25)]
