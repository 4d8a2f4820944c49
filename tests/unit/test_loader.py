"""The loader: GGUF weights, config and tokenizer equal transformers' own GGUF reading; sharded safetensors;
.bin with weights_only; dummy weights; dtype and context-length helpers; clear errors for bad model paths."""

from __future__ import annotations

import json
import os

import pytest
import torch

from octavo.config import ModelSettings
from octavo.core.loader import (
    get_eos_token_ids,
    get_max_model_len,
    iter_weights,
    load_model,
    load_tokenizer,
    resolve_dtype,
    resolve_model,
)
from tests.utils import smollm2_gguf_path, smollm2_safetensors_dir

TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\nnew lines",
    "naïve café — déjà vu, 日本語のテキスト, emoji 🚀🔥",
    "def f(x):\n    return x ** 2  # code",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
    "",
]


@pytest.fixture(scope="module")
def gguf_resolved():
    return resolve_model(ModelSettings(model=smollm2_gguf_path()))


@pytest.fixture(scope="module")
def hf_dir():
    return smollm2_safetensors_dir("float32")


def _tiny_llama_dir(tmp_path, **save_kwargs):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         architectures=["LlamaForCausalLM"], tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path, **save_kwargs)
    return model


def _model_cls():
    from octavo.plugins.models.llama import LlamaForCausalLM

    return LlamaForCausalLM


# ----------------------------------------------------------------------------------------- GGUF

def test_default_model_is_the_embedded_gguf(gguf_resolved):
    assert gguf_resolved.format == "gguf"
    assert gguf_resolved.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert gguf_resolved.architecture == "LlamaForCausalLM"
    assert resolve_model(ModelSettings()).gguf_path == gguf_resolved.gguf_path


def test_gguf_config_matches_transformers(gguf_resolved):
    from transformers import AutoConfig

    ref = AutoConfig.from_pretrained(gguf_resolved.path, gguf_file=gguf_resolved.gguf_file)
    ours = gguf_resolved.hf_config
    for key in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "eos_token_id", "rope_parameters"):
        assert getattr(ours, key) == getattr(ref, key), key


def test_gguf_weights_equal_transformers_dequantized(gguf_resolved, hf_dir):
    """Every tensor octavo reads from the GGUF (q/k un-permuted) equals transformers' dequantized one."""
    from safetensors import safe_open

    with safe_open(os.path.join(hf_dir, "model.safetensors"), framework="pt") as f:
        ref_names = set(f.keys())
        seen = set()
        for name, tensor in iter_weights(gguf_resolved):
            assert name in ref_names, f"{name} is not a transformers parameter name"
            ref = f.get_tensor(name)
            assert tensor.shape == ref.shape, name
            torch.testing.assert_close(tensor.float(), ref, rtol=0, atol=1e-7, msg=name)
            seen.add(name)
    assert seen == ref_names - {"lm_head.weight"}  # tied: the GGUF has no output.weight


def test_gguf_tokenizer_equals_transformers(gguf_resolved):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(gguf_resolved.path, gguf_file=gguf_resolved.gguf_file)
    ours = load_tokenizer(ModelSettings(model=gguf_resolved.gguf_path))
    assert ours.chat_template == ref.chat_template and ours.chat_template
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (ref.bos_token_id, ref.eos_token_id,
                                                                       ref.pad_token_id) == (1, 2, 2)
    assert len(ours) == len(ref)
    for text in TEXTS:
        ids = ours(text)["input_ids"]
        assert ids == ref(text)["input_ids"], text
        assert ours.decode(ids) == ref.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a prime."}]
    for gen in (True, False):
        assert ours.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen) == \
            ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)


def test_gguf_eos_and_context_length(gguf_resolved):
    assert get_eos_token_ids(gguf_resolved) == [2]
    assert get_max_model_len(gguf_resolved.hf_config) == 8192
    assert get_max_model_len(gguf_resolved.hf_config, 2048) == 2048
    with pytest.raises(ValueError, match="max_model_len=9000 exceeds"):
        get_max_model_len(gguf_resolved.hf_config, 9000)


def test_safetensors_copy_tokenizer_has_chat_template(hf_dir):
    tok = load_tokenizer(ModelSettings(model=str(hf_dir)))
    assert (hf_dir / "chat_template.jinja").is_file()
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False).startswith("<|im_start|>")


# ------------------------------------------------------------------------------- safetensors / pt

def test_sharded_safetensors_with_index(tmp_path):
    ref = _tiny_llama_dir(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "the fixture must really be sharded"
    resolved = resolve_model(ModelSettings(model=str(tmp_path)))
    assert resolved.format == "safetensors" and resolved.gguf_file is None
    names = {name for name, _ in iter_weights(resolved)}
    assert names == set(ref.state_dict())
    model = load_model(resolved, model_cls=_model_cls(), dtype=torch.float32, device="cpu")
    sd = ref.state_dict()
    q, k, v = (sd[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv")
    assert torch.equal(model.model.layers[1].self_attn.qkv_proj.weight, torch.cat([q, k, v]))
    assert torch.equal(model.lm_head.weight, sd["lm_head.weight"])
    # a missing shard is named
    os.remove(tmp_path / sorted(set(index["weight_map"].values()))[-1])
    with pytest.raises(ValueError, match="shards that are missing"):
        list(iter_weights(resolved))


def test_bfloat16_load_converts(tmp_path):
    ref = _tiny_llama_dir(tmp_path)
    model = load_model(resolve_model(ModelSettings(model=str(tmp_path))), model_cls=_model_cls(),
                       dtype=torch.bfloat16, device="cpu")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert torch.equal(model.model.norm.weight, ref.model.norm.weight.to(torch.bfloat16))


def test_pt_checkpoint_loads_with_weights_only(tmp_path):
    ref = _tiny_llama_dir(tmp_path)
    os.remove(tmp_path / "model.safetensors")
    torch.save(ref.state_dict(), tmp_path / "pytorch_model.bin")
    resolved = resolve_model(ModelSettings(model=str(tmp_path)))
    assert resolved.format == "pt"
    model = load_model(resolved, model_cls=_model_cls(), dtype=torch.float32, device="cpu")
    assert torch.equal(model.model.embed_tokens.weight, ref.model.embed_tokens.weight)
    # a pickle carrying arbitrary objects is refused (weights_only=True), never executed
    torch.save({"model.norm.weight": torch.ones(32), "evil": _Evil()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        list(iter_weights(resolved))


class _Evil:
    pass


def test_incomplete_checkpoint_names_missing_weights(tmp_path):
    from safetensors.torch import load_file, save_file

    _tiny_llama_dir(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    del sd["model.layers.0.mlp.down_proj.weight"]
    save_file(sd, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks weights for model\.layers\.0\.mlp\.down_proj\.weight"):
        load_model(resolve_model(ModelSettings(model=str(tmp_path))), model_cls=_model_cls(),
                   dtype=torch.float32, device="cpu")


# ------------------------------------------------------------------------------------------ dummy

def test_dummy_from_config_only(tmp_path):
    _tiny_llama_dir(tmp_path)
    for f in tmp_path.iterdir():
        if f.name != "config.json":
            f.unlink()
    with pytest.raises(ValueError, match="load_format='dummy'"):
        resolve_model(ModelSettings(model=str(tmp_path)))
    resolved = resolve_model(ModelSettings(model=str(tmp_path), load_format="dummy"))
    assert resolved.format == "dummy"
    model = load_model(resolved, model_cls=_model_cls(), dtype=torch.float32, device="cpu")
    w = model.model.layers[0].mlp.gate_up_proj.weight
    assert w.abs().max() <= 1e-3 and w.abs().max() > 0 and torch.isfinite(w).all()
    assert torch.all(model.model.norm.weight == 1)


def test_hf_overrides_apply(tmp_path):
    _tiny_llama_dir(tmp_path)
    resolved = resolve_model(ModelSettings(model=str(tmp_path), hf_overrides={"max_position_embeddings": 32}))
    assert get_max_model_len(resolved.hf_config) == 32


# ----------------------------------------------------------------------------------------- errors

def test_unknown_path_says_what_was_looked_for(tmp_path):
    with pytest.raises(ValueError, match=r"not found: it is not an existing \.gguf file, not a directory"):
        resolve_model(ModelSettings(model=str(tmp_path / "nope" / "model")))


def test_unreachable_repo_id_is_a_value_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="downloading it as a Hugging Face repo id failed"):
        resolve_model(ModelSettings(model="octavo-test/definitely-not-cached"))


def test_directory_without_config(tmp_path):
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="has no config.json"):
        resolve_model(ModelSettings(model=str(tmp_path)))


def test_non_gguf_file(tmp_path):
    path = tmp_path / "model.txt"
    path.write_text("hi")
    with pytest.raises(ValueError, match="not a .gguf"):
        resolve_model(ModelSettings(model=str(path)))


def test_missing_tokenizer_points_to_skip(tmp_path):
    _tiny_llama_dir(tmp_path)
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        load_tokenizer(ModelSettings(model=str(tmp_path)))
    assert load_tokenizer(ModelSettings(model=str(tmp_path), skip_tokenizer_init=True)) is None


# ------------------------------------------------------------------------------------------ dtype

def test_resolve_dtype():
    assert resolve_dtype("auto", None, "float32") == torch.float32
    assert resolve_dtype("bf16", None, "float32", ["float32", "bfloat16"]) == torch.bfloat16

    class Cfg:
        dtype = torch.bfloat16

    assert resolve_dtype("auto", Cfg(), "float16", ["float16", "bfloat16"]) == torch.bfloat16
    with pytest.raises(ValueError, match="not supported on this platform"):
        resolve_dtype("float16", None, "float32", ["float32", "bfloat16"])
