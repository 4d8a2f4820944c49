"""Every built-in model family beyond the Llama file passes ``ModelContract`` against transformers (fp32),
and, through the public ``LLM`` with ``dtype="float32"``, gives transformers' prompt log-probabilities
(within 1e-4) and identical greedy tokens. Sliding-window configs use a window (8) shorter than the prompts.

Tiny random checkpoints (2 layers, hidden 64) are saved with ``save_pretrained`` plus a real word-level
tokenizer covering the whole (small) vocabulary, so the engine's tokenizer path runs as for a real model.
"""

from __future__ import annotations

import random

import pytest
import torch
import transformers as T

from octavo.plugins.models.gemma import Gemma2ForCausalLM, Gemma3ForCausalLM, GemmaForCausalLM
from octavo.plugins.models.gpt2 import GPT2LMHeadModel
from octavo.plugins.models.mixtral import MixtralForCausalLM
from octavo.plugins.models.opt import OPTForCausalLM
from octavo.plugins.models.phi3 import Phi3ForCausalLM
from octavo.plugins.models.qwen3 import Qwen3ForCausalLM, Qwen3MoeForCausalLM
from octavo.testing.model import ModelContract

VOCAB = 256
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, **IDS)
KV_BYTES = 16 << 20  # a small cache: on a GPU the default would take 90% of memory per LLM in this process
WINDOW = 8  # shorter than the 23- and 40-token prompts of the contract and the prompts below


def save_word_tokenizer(path: str, vocab_size: int = VOCAB) -> None:
    """A real (word-level) fast tokenizer whose vocabulary is exactly the model's: ids never fall outside."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = T.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(path)


class LLMParity(ModelContract):
    """Adds the engine-level check: greedy tokens and prompt logprobs through ``LLM`` equal transformers'."""

    num_new_tokens = 6

    def test_llm_greedy_and_prompt_logprobs_match_transformers(self, checkpoints):
        from octavo import LLM, SamplingParams

        name, (path, ref) = next(iter(checkpoints.items()))
        save_word_tokenizer(path, ref.config.vocab_size)
        rng = random.Random(7)
        prompts = [[rng.randrange(3, ref.config.vocab_size) for _ in range(n)] for n in (19, 33)]
        llm = LLM(path, dtype="float32", seed=0, max_model_len=64, enable_prefix_caching=False, kv_cache_memory_bytes=KV_BYTES)
        params = SamplingParams(temperature=0, max_tokens=self.num_new_tokens, ignore_eos=True, prompt_logprobs=0)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        for prompt, out in zip(prompts, outs):
            seq = list(prompt)
            with torch.no_grad():
                for _ in range(self.num_new_tokens):  # plain greedy loop over raw transformers logits
                    seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
                want_lp = torch.log_softmax(ref(torch.tensor([prompt])).logits[0].float(), -1)
            assert list(out.outputs[0].token_ids) == seq[len(prompt):], f"{name}: greedy tokens differ"
            got = out.prompt_logprobs
            assert got[0] is None and len(got) == len(prompt)
            for i in range(1, len(prompt)):
                lp = got[i][prompt[i]].logprob
                assert abs(lp - want_lp[i - 1, prompt[i]].item()) <= 1e-4, f"{name}: prompt logprob {i}"


class TestQwen3Contract(LLMParity):
    model_cls = Qwen3ForCausalLM
    configs = {"qwen3": T.Qwen3Config(architectures=["Qwen3ForCausalLM"], head_dim=32, tie_word_embeddings=True,
                                      **TINY)}


class TestQwen3MoeContract(LLMParity):
    model_cls = Qwen3MoeForCausalLM
    # layer 1 stays dense (mlp_only_layers); top-2 weights are not renormalised (norm_topk_prob=False)
    configs = {"qwen3-moe": T.Qwen3MoeConfig(architectures=["Qwen3MoeForCausalLM"], num_experts=4,
                                             num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False,
                                             mlp_only_layers=[1], **TINY)}


class TestMixtralContract(LLMParity):
    model_cls = MixtralForCausalLM
    configs = {"mixtral-window": T.MixtralConfig(architectures=["MixtralForCausalLM"], num_local_experts=4,
                                                 num_experts_per_tok=2, sliding_window=WINDOW, **TINY)}


class TestGemmaContract(LLMParity):
    model_cls = GemmaForCausalLM
    configs = {"gemma": T.GemmaConfig(architectures=["GemmaForCausalLM"], head_dim=16, **TINY)}


class TestGemma2Contract(LLMParity):
    model_cls = Gemma2ForCausalLM
    # small caps so tanh actually bends random-weight scores/logits; a scale unlike head_dim. The reference
    # must run eager attention: transformers' SDPA path for Gemma 2 (the default in 5.17) ignores the cap.
    configs = {"gemma2": T.Gemma2Config(architectures=["Gemma2ForCausalLM"], head_dim=16, sliding_window=WINDOW,
                                        attn_implementation="eager",
                                        attn_logit_softcapping=0.5, final_logit_softcapping=0.4,
                                        query_pre_attn_scalar=24, **TINY)}


class TestGemma3Contract(LLMParity):
    model_cls = Gemma3ForCausalLM
    configs = {"gemma3": T.Gemma3TextConfig(
        architectures=["Gemma3ForCausalLM"], head_dim=16, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0}},
        **TINY)}


class TestPhi3Contract(LLMParity):
    model_cls = Phi3ForCausalLM
    configs = {"phi3-window": T.Phi3Config(architectures=["Phi3ForCausalLM"], sliding_window=WINDOW,
                                           tie_word_embeddings=False, **TINY)}


class TestGPT2Contract(LLMParity):
    model_cls = GPT2LMHeadModel
    configs = {"gpt2": T.GPT2Config(architectures=["GPT2LMHeadModel"], vocab_size=VOCAB, n_embd=64, n_layer=2,
                                    n_head=4, n_positions=128, **IDS)}


class TestOPTContract(LLMParity):
    model_cls = OPTForCausalLM
    configs = {"opt": T.OPTConfig(architectures=["OPTForCausalLM"], vocab_size=VOCAB, hidden_size=64, ffn_dim=128,
                                  num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
                                  word_embed_proj_dim=64, **IDS)}


class TestOPTPostNormProjContract(ModelContract):
    """opt-350m's layout: norms after the residual add, no final norm, project_in/out around the decoder."""

    model_cls = OPTForCausalLM
    configs = {"opt-350m-like": T.OPTConfig(architectures=["OPTForCausalLM"], vocab_size=VOCAB, hidden_size=64,
                                            ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                                            max_position_embeddings=128, word_embed_proj_dim=32,
                                            do_layer_norm_before=False, **IDS)}


def test_decoder_last_token_pooling_for_task_embed(tmp_path):
    """``task="embed"`` on a decoder: the engine pools each prompt's last hidden state, L2-normalised."""
    from octavo import LLM

    config = T.Qwen3Config(architectures=["Qwen3ForCausalLM"], head_dim=32, **TINY)
    torch.manual_seed(0)
    ref = T.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    ref.save_pretrained(tmp_path)
    save_word_tokenizer(str(tmp_path))
    prompts = [[5, 9, 30, 7], list(range(3, 40))]
    llm = LLM(str(tmp_path), dtype="float32", task="embed", max_model_len=64, kv_cache_memory_bytes=KV_BYTES)
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            hidden = ref.model(torch.tensor([prompt])).last_hidden_state[0, -1]
        want = torch.nn.functional.normalize(hidden, dim=-1)
        got = torch.tensor(out.outputs.embedding)
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


@pytest.mark.parametrize("name", ["FancyNewForCausalLM"])
def test_unsupported_architecture_is_a_clear_error(tmp_path, name):
    from octavo import LLM

    config = T.LlamaConfig(architectures=[name], **TINY)
    config.save_pretrained(tmp_path)
    save_word_tokenizer(str(tmp_path))
    with pytest.raises(ValueError, match=name) as info:
        LLM(str(tmp_path), load_format="dummy")
    assert "octavo plugins" in str(info.value)


@pytest.mark.parametrize("mode", ["cls", "mean", "max"])
def test_bert_pooling_modes_match_transformers(tmp_path, mode):
    """Tiny random BERT saved as a sentence-transformers directory (E5/BGE use CLS, MiniLM mean): LLM.embed
    equals transformers' last hidden state pooled the declared way and L2-normalised."""
    import json

    from octavo import LLM

    config = T.BertConfig(architectures=["BertModel"], vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128, pad_token_id=0)
    torch.manual_seed(3)
    ref = T.BertModel(config, add_pooling_layer=False).eval()
    from octavo.testing.model import randomize_

    randomize_(ref, seed=3)
    ref.save_pretrained(tmp_path)
    save_word_tokenizer(str(tmp_path))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 64, "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": mode == "max"}))
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    rng = random.Random(mode)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (1, 9, 30)]
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=128, kv_cache_memory_bytes=KV_BYTES)
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            hidden = ref(torch.tensor([prompt])).last_hidden_state[0]
        pooled = {"cls": hidden[0], "mean": hidden.mean(0), "max": hidden.amax(0)}[mode]
        want = torch.nn.functional.normalize(pooled, dim=-1)
        got = torch.tensor(out.outputs.embedding)
        assert torch.allclose(got, want, atol=1e-5), (mode, (got - want).abs().max())
