"""The light config path (core/loader/light_config.py) resolves every field exactly as transformers does.

For each light family: tiny configs saved by transformers' ``save_pretrained`` (how every test checkpoint is
written) and hand-written ``config.json`` files in the older styles found on the hub (``rope_theta`` +
``rope_scaling`` of each type, ``torch_dtype``, generation keys, labels, aliases, sliding windows, legacy layer
type names), the Llama-3-8B shape of the GPU start benchmark, and the embedded GGUF. Every attribute of either
object, plus the ones octavo's models read, must be equal; so must ``rope_config`` (what the rotary layer uses).
Also: the stored tables equal the installed transformers', and resolving never imports transformers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import transformers as T

from octavo.config import ModelSettings
from octavo.core.loader import resolve_model
from octavo.core.loader.config_tables_gen import generate
from octavo.core.loader.light_config import LightConfig, light_config, tables
from octavo.nn.rotary import rope_config
from tests.utils import smollm2_gguf_path

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
#: attributes octavo's models, loader and worker read (some are aliases or properties, absent from to_dict)
READ = ["hidden_size", "rms_norm_eps", "vocab_size", "max_position_embeddings", "hidden_act", "tie_word_embeddings",
        "sliding_window", "num_hidden_layers", "num_attention_heads", "intermediate_size", "layer_types",
        "num_key_value_heads", "num_experts", "num_local_experts", "num_experts_per_tok", "attention_bias",
        "head_dim", "rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor", "mlp_bias",
        "moe_intermediate_size", "norm_topk_prob", "mlp_only_layers", "decoder_sparse_step", "num_labels",
        "id2label", "label2id", "pad_token_id", "bos_token_id", "eos_token_id", "dtype", "torch_dtype",
        "architectures", "model_type", "quantization_config", "name_or_path", "_name_or_path",
        "use_sliding_window", "max_window_layers", "temperature", "max_length", "use_cache", "problem_type"]

SAVED = {  # transformers-written config.json files (save_pretrained keeps only non-default values)
    "llama": T.LlamaConfig(architectures=["LlamaForCausalLM"], **TINY),
    "llama-head-dim": T.LlamaConfig(architectures=["LlamaForCausalLM"], head_dim=32, attention_bias=True, **TINY),
    "mistral-window": T.MistralConfig(architectures=["MistralForCausalLM"], sliding_window=8, **TINY),
    "qwen2": T.Qwen2Config(architectures=["Qwen2ForCausalLM"], **TINY),
    "qwen3": T.Qwen3Config(architectures=["Qwen3ForCausalLM"], head_dim=32, tie_word_embeddings=True, **TINY),
    "qwen3-window": T.Qwen3Config(architectures=["Qwen3ForCausalLM"], use_sliding_window=True, sliding_window=8,
                                  max_window_layers=2, **TINY),
    "qwen3_moe": T.Qwen3MoeConfig(architectures=["Qwen3MoeForCausalLM"], num_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=32, mlp_only_layers=[1], **TINY),
    "mixtral": T.MixtralConfig(architectures=["MixtralForCausalLM"], num_local_experts=4, **TINY),
    "llama-seqcls": T.LlamaConfig(architectures=["LlamaForSequenceClassification"], num_labels=3, **TINY),
}
_LLAMA = dict(TINY, model_type="llama", architectures=["LlamaForCausalLM"])
RAW = {  # config.json files as older tools wrote them
    "llama3-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                      intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
                      hidden_act="silu", tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
                      torch_dtype="bfloat16"),
    "llama3.1-rope": dict(_LLAMA, rope_theta=500000.0, torch_dtype="bfloat16", rope_scaling={
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
        "rope_type": "llama3"}, eos_token_id=[1, 2], temperature=0.6, top_p=0.9, transformers_version="4.43.0"),
    "llama-yarn-type": dict(_LLAMA, rope_scaling={"type": "yarn", "factor": 4.0}, max_position_embeddings=256),
    "llama-linear": dict(_LLAMA, rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_theta=1e6),
    "llama-dynamic": dict(_LLAMA, rope_scaling={"type": "dynamic", "factor": 2.0}),
    "llama-partial": dict(_LLAMA, partial_rotary_factor=0.5, rope_theta=20000.0),
    "llama-v5-rope": dict(_LLAMA, rope_parameters={"rope_type": "default", "rope_theta": 123.0}, dtype="float32"),
    "llama-labels": dict(_LLAMA, id2label={"0": "neg", "1": "pos", "2": "mid"}, num_labels=3,
                         problem_type="single_label_classification", max_length=20, do_sample=True),
    "llama-extra": dict(_LLAMA, quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic"},
                        custom_key=[1, 2], _name_or_path="/somewhere/else", use_cache=False, pretraining_tp=2),
    "mistral-v0.1": dict(TINY, model_type="mistral", architectures=["MistralForCausalLM"], rope_theta=1e6,
                         sliding_window=None, torch_dtype="bfloat16"),
    "qwen2-window-legacy": dict(TINY, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                                use_sliding_window=True, sliding_window=16, max_window_layers=1,
                                rope_theta=1e6, tie_word_embeddings=True),
    "qwen3-legacy-types": dict(TINY, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=16,
                               layer_types=["attention", "full_attention", "attention", "full_attention"]),
    "qwen3_moe-legacy": dict(TINY, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
                             num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2,
                             rope_theta=1e6, torch_dtype="bfloat16"),
    "mixtral-alias": dict(TINY, model_type="mixtral", architectures=["MixtralForCausalLM"], num_experts=4,
                          rope_theta=1e6, router_aux_loss_coef=0.02, output_router_logits=True),
    "no-architectures": dict(TINY, model_type="qwen2"),
}

_MISSING = object()


def _value(cfg, key):
    try:
        value = getattr(cfg, key)
    except AttributeError:
        return _MISSING
    return value.to_dict() if hasattr(value, "to_dict") and not isinstance(cfg, type) else value


def assert_same(light, ref, name: str) -> None:
    assert isinstance(light, LightConfig), f"{name}: the light path was not taken"
    keys = set(ref.to_dict()) | set(light.to_dict()) | set(READ)
    diff = {k: (_value(light, k), _value(ref, k)) for k in sorted(keys) if _value(light, k) != _value(ref, k)}
    assert not diff, f"{name}: light vs transformers differ: {diff}"
    assert rope_config(light) == rope_config(ref), name
    assert light.get_text_config() is light


def _write(tmp_path, name: str, config: dict) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


@pytest.mark.parametrize("name", sorted(SAVED))
def test_saved_configs_resolve_like_transformers(tmp_path, name):
    d = str(tmp_path / name)
    SAVED[name].save_pretrained(d)
    resolved = resolve_model(ModelSettings(model=d, load_format="dummy"))
    assert_same(resolved.hf_config, T.AutoConfig.from_pretrained(d), name)


@pytest.mark.parametrize("name", sorted(RAW))
def test_raw_configs_resolve_like_transformers(tmp_path, name):
    d = _write(tmp_path, name, RAW[name])
    resolved = resolve_model(ModelSettings(model=d, load_format="dummy"))
    ref = T.AutoConfig.from_pretrained(d)
    assert_same(resolved.hf_config, ref, name)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    want = (ref.architectures or [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[ref.model_type]])[0]
    assert resolved.architecture == want


def test_embedded_gguf_config_like_transformers(monkeypatch):
    from octavo.core.loader.gguf_file import gguf_hf_config

    light = gguf_hf_config(smollm2_gguf_path())
    monkeypatch.setenv("OCTAVO_LIGHT_CONFIG", "0")
    ref = gguf_hf_config(smollm2_gguf_path())
    assert not isinstance(ref, LightConfig)
    assert_same(light, ref, "smollm2 gguf")


def test_invalid_configs_fail_as_in_transformers(tmp_path):
    bad_heads = dict(_LLAMA, num_attention_heads=3)
    with pytest.raises(ValueError, match="not a multiple"):
        light_config(bad_heads)
    bad_types = dict(TINY, model_type="qwen3", layer_types=["full_attention"])
    with pytest.raises(ValueError, match="layer_types"):
        light_config(bad_types)


def test_fallbacks_to_transformers(tmp_path, monkeypatch):
    """Overrides, remote code, nested configs and other families take transformers' path."""
    d = _write(tmp_path, "llama", _LLAMA)
    over = resolve_model(ModelSettings(model=d, load_format="dummy", hf_overrides={"max_position_embeddings": 64}))
    assert not isinstance(over.hf_config, LightConfig) and over.hf_config.max_position_embeddings == 64
    d2 = _write(tmp_path, "gpt2", dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=2, n_embd=64,
                                       n_head=4, vocab_size=128))
    assert not isinstance(resolve_model(ModelSettings(model=d2, load_format="dummy")).hf_config, LightConfig)
    monkeypatch.setenv("OCTAVO_LIGHT_CONFIG", "0")
    assert not isinstance(resolve_model(ModelSettings(model=d, load_format="dummy")).hf_config, LightConfig)
    monkeypatch.setenv("OCTAVO_LIGHT_CONFIG", "yes")
    with pytest.raises(ValueError, match="OCTAVO_LIGHT_CONFIG"):
        resolve_model(ModelSettings(model=d, load_format="dummy"))


def test_tables_match_installed_transformers():
    """A transformers upgrade that changes a family's default shows here: rerun config_tables_gen."""
    assert json.loads(json.dumps(generate())) == {**tables(), "transformers_version": T.__version__}


def test_resolving_imports_no_transformers(tmp_path):
    d = _write(tmp_path, "llama3", RAW["llama3-8b"])
    code = ("import sys; from octavo.config import ModelSettings; from octavo.core.loader import resolve_model; "
            f"r = resolve_model(ModelSettings(model={d!r}, load_format='dummy')); "
            f"g = resolve_model(ModelSettings(model={smollm2_gguf_path()!r})); "
            "print(r.architecture, g.architecture, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, OCTAVO_LIGHT_CONFIG="1"))
    assert out.stdout.split() == ["LlamaForCausalLM", "LlamaForCausalLM", "False"], out.stderr[-2000:]
