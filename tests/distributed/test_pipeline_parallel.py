"""Pipeline parallelism on CPU (gloo): stages give the single-process greedy tokens and logprobs.

Bounded for ``make test`` (one 4-process engine, ~60 s on 2 loaded cores): a random-weight Qwen3-MoE with
tied embeddings and 3 layers at TP=2 x PP=2 (uneven split 2 + 1; experts and attention sharded within each
stage; the last stage holds the tied LM head without the embedding and loads the checkpoint's embedding
matrix into it). The full model x mode matrix (SmolLM2, Llama, Qwen3, Qwen3-MoE x TP, PP, TP x PP, DP, and
ray) is tests/distributed/test_parallel_matrix.py (``make distributed``). The rest are refusals and the layer
split, checked without processes.
"""

from __future__ import annotations

import pytest
import torch
import transformers as T

from octavo.testing.model import randomize_
from tests.distributed.test_tensor_parallel import assert_same, run
from tests.plugins.test_model_contracts import TINY, save_word_tokenizer

QWEN3_MOE = T.Qwen3MoeConfig(architectures=["Qwen3MoeForCausalLM"], num_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=32, norm_topk_prob=False, mlp_only_layers=[1], tie_word_embeddings=True,
                             **{**TINY, "num_hidden_layers": 3})


def save_checkpoint(config, path) -> str:
    torch.manual_seed(0)
    ref = T.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_(ref)
    ref.save_pretrained(path)
    save_word_tokenizer(str(path))
    return str(path)


def test_qwen3_moe_tp2_x_pp2_equals_single_process(tmp_path):
    path = save_checkpoint(QWEN3_MOE, tmp_path)
    assert_same(run(path), run(path, tensor_parallel_size=2, pipeline_parallel_size=2))


def test_stage_layer_ranges_cover_every_layer_once():
    from octavo.nn.pipeline import stage_layer_range

    assert [stage_layer_range(3, s, 2) for s in range(2)] == [(0, 2), (2, 3)]
    assert [stage_layer_range(30, s, 4) for s in range(4)] == [(0, 7), (7, 15), (15, 23), (23, 30)]
    assert stage_layer_range(5, 0, 1) == (0, 5)
    with pytest.raises(ValueError, match="num_hidden_layers=2 cannot be split into pipeline_parallel_size=3"):
        stage_layer_range(2, 0, 3)


def test_pipeline_refusals_name_the_setting():
    from octavo.config import OctavoSettings
    from octavo.core.executor import executor_name
    from octavo.core.plugin_manager import get_plugin_manager
    from octavo.core.pp_runner import check_pipeline_settings
    from octavo.plugins.models.gemma import GemmaForCausalLM
    from octavo.plugins.models.llama import LlamaForCausalLM
    from octavo.plugins.models.phi3 import Phi3ForCausalLM

    cpu = get_plugin_manager().resolve("platforms", "cpu")()
    assert executor_name(OctavoSettings.from_kwargs(pipeline_parallel_size=2)) == "mp"
    with pytest.raises(ValueError, match="'uni'"):
        executor_name(OctavoSettings.from_kwargs(pipeline_parallel_size=2, distributed_executor_backend="uni"))
    pp2 = OctavoSettings.from_kwargs(pipeline_parallel_size=2)
    check_pipeline_settings(pp2, LlamaForCausalLM, cpu)
    for cls in (GemmaForCausalLM, Phi3ForCausalLM):  # subclasses that reshape the model must opt in themselves
        with pytest.raises(ValueError, match=f"pipeline_parallel_size=2: {cls.__name__} cannot be split"):
            check_pipeline_settings(pp2, cls, cpu)
    for kw, name in (({"enable_lora": True}, "enable_lora"), ({"task": "embed"}, "task='embed'"),
                     ({"task": "reward"}, "task='reward'"), ({"runner": "pooling"}, "(task='embed'|runner='pooling')"),
                     ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2,
                                              "prompt_lookup_max": 2}}, "speculative_config")):
        with pytest.raises(ValueError, match=f"{name}.*pipeline_parallel_size"):
            check_pipeline_settings(OctavoSettings.from_kwargs(pipeline_parallel_size=2, **kw), LlamaForCausalLM, cpu)
