"""Which quantizer a model loads with: from the setting or the checkpoint, and every misfit fails at start."""

from __future__ import annotations

import json
import os

import pytest

from octavo.core.loader import resolve_model
from octavo.core.loader.quant import resolve_quantizer
from octavo.core.plugin_manager import get_plugin_manager
from tests.quant.helpers import CPU


class CUDA:
    name, device_type = "cuda", "cuda"


def _resolved(model: str | None, load_format: str = "auto"):
    from octavo.config import OctavoSettings

    return resolve_model(OctavoSettings.from_kwargs(model=model, load_format=load_format).model)


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    from transformers import LlamaConfig

    path = str(tmp_path_factory.mktemp("dense"))
    LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gptq_dir(dense_dir, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gptq"))
    with open(os.path.join(dense_dir, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def _error(quantization, resolved, platform=CPU()) -> str:
    with pytest.raises(ValueError) as info:
        resolve_quantizer(quantization, resolved, platform, get_plugin_manager())
    return str(info.value)


def test_unknown_method_names_the_registered_ones(dense_dir):
    msg = _error("no-such-method", _resolved(dense_dir, "dummy"))
    assert "no-such-method" in msg and "Registered quantizers:" in msg
    for name in ("gguf", "gptq", "awq", "int4", "int8", "fp8"):
        assert name in msg
    assert "on this platform (cpu, cpu): " in msg and "fp8" not in msg.split("on this platform")[1]


def test_checkpoint_format_on_a_dense_checkpoint_fails(dense_dir):
    msg = _error("gptq", _resolved(dense_dir, "dummy"))
    assert "dense" in msg and "int8" in msg and "int4" in msg


def test_fp8_on_cpu_fails_naming_the_platform(dense_dir):
    msg = _error("fp8", _resolved(dense_dir, "dummy"))
    assert "cannot run on platform cpu" in msg and "cuda" in msg


def test_method_that_does_not_fit_the_checkpoint(gptq_dir):
    msg = _error("int4", _resolved(gptq_dir, "dummy"))
    assert "quantized with 'gptq'" in msg


def test_checkpoint_method_is_used_when_unset(gptq_dir):
    quantizer = resolve_quantizer(None, _resolved(gptq_dir, "dummy"), CPU(), get_plugin_manager())
    assert quantizer.name == "gptq" and quantizer.group_size == 32


def test_fp8_resolves_on_cuda(dense_dir):
    quantizer = resolve_quantizer("fp8", _resolved(dense_dir, "dummy"), CUDA(), get_plugin_manager())
    assert quantizer.name == "fp8"


def test_dense_stays_dense(dense_dir):
    assert resolve_quantizer(None, _resolved(dense_dir, "dummy"), CPU(), get_plugin_manager()) is None


def test_embedded_gguf_is_quantized_unless_told_none():
    resolved = _resolved(None)
    quantizer = resolve_quantizer(None, resolved, CPU(), get_plugin_manager())
    assert quantizer.name == "gguf"
    assert set(quantizer.tensor_types.values()) >= {3}  # Q4_1 linear layers
    assert resolve_quantizer("none", resolved, CPU(), get_plugin_manager()) is None
    assert "quantized with 'gguf'" in _error("int8", resolved)


def test_dummy_weights_quantize_online_but_not_as_a_checkpoint_format(dense_dir, gptq_dir):
    import torch

    from octavo.core.loader import load_model

    pm = get_plugin_manager()
    resolved = _resolved(dense_dir, "dummy")
    quantizer = resolve_quantizer("int8", resolved, CPU(), pm)
    model = load_model(resolved, model_cls=pm.resolve("models", resolved.architecture), dtype=torch.float32,
                       device="cpu", quantizer=quantizer)
    assert model.model.layers[0].mlp.down_proj.qweight.dtype == torch.int8
    resolved = _resolved(gptq_dir, "dummy")
    quantizer = resolve_quantizer(None, resolved, CPU(), pm)
    with pytest.raises(ValueError, match="dummy"):
        load_model(resolved, model_cls=pm.resolve("models", resolved.architecture), dtype=torch.float32,
                   device="cpu", quantizer=quantizer)
