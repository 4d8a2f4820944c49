"""The Llama-family model plugin passes the model contract: tiny random Llama (several rope types, tied and
untied), Mistral (sliding window) and Qwen2 (qkv bias) against transformers in float32."""

from transformers import LlamaConfig, MistralConfig, Qwen2Config

from octavo.plugins.models.llama import LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
from octavo.testing.model import ModelContract

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)


def _llama(**kw):
    return LlamaConfig(architectures=["LlamaForCausalLM"], **{**TINY, **kw})


class TestLlamaContract(ModelContract):
    model_cls = LlamaForCausalLM
    configs = {
        "llama-untied": _llama(tie_word_embeddings=False, rope_parameters={"rope_type": "default",
                                                                          "rope_theta": 10000.0}),
        "llama-tied-gqa1": _llama(tie_word_embeddings=True, num_key_value_heads=1,
                                  rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
        # llama 3.1 scaling with a short original context, so the prompts run past it
        "llama3-rope": _llama(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 16}),
        "linear-rope": _llama(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
        "yarn-rope": _llama(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                             "original_max_position_embeddings": 32}),
        "dynamic-rope": _llama(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
        "mlp-attn-bias": _llama(attention_bias=True, mlp_bias=True, head_dim=32),
    }


class TestMistralContract(ModelContract):
    model_cls = MistralForCausalLM
    configs = {"mistral-window": MistralConfig(architectures=["MistralForCausalLM"], sliding_window=8, **TINY)}


class TestQwen2Contract(ModelContract):
    model_cls = Qwen2ForCausalLM
    configs = {"qwen2": Qwen2Config(architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True, **TINY)}
