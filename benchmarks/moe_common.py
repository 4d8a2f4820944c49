"""What the MoE end-to-end benchmarks share (``moe_e2e.py`` batch 1, ``moe_tput.py`` throughput): the model shapes
(full and ``--tiny``), the copy-bandwidth measurement, building an ``LLM`` on random weights, timed generation."""

from __future__ import annotations

import functools
import gc
import time

SHAPES = {
    "qwen3-30b-a3b": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048,
                          intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                          num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                          vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6,
                          hidden_act="silu", tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645,
                          torch_dtype="bfloat16"),
    "mixtral-8x7b": dict(architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         num_local_experts=8, num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=32768,
                         rms_norm_eps=1e-5, rope_theta=1e6, hidden_act="silu", tie_word_embeddings=False,
                         sliding_window=None, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16"),
}
TINY = {"qwen3-30b-a3b": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16, num_experts=16, num_experts_per_tok=4, vocab_size=512),
        "mixtral-8x7b": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                             vocab_size=512)}


def config(shape: str, layers: int, tiny: bool) -> dict:
    return dict(SHAPES[shape], **(TINY[shape] if tiny else {}), num_hidden_layers=layers)


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _free():
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@functools.cache
def bandwidth(tiny: bool) -> float:
    """Copy bandwidth, read + write bytes per second (gpu_e2e's measurement; a host copy for --tiny)."""
    import torch

    if torch.cuda.is_available() and not tiny:
        from gpu_e2e import copy_bandwidth

        bw = copy_bandwidth()
        _free()
        return bw
    a = torch.ones(1 << 24)
    b = torch.empty_like(a)
    t = time.perf_counter()
    b.copy_(a)
    return 2 * a.numel() * 4 / (time.perf_counter() - t)


def make_llm(cfg: dict, tmp: str, tag: str, **kw):
    from gpu_e2e import write_config

    from octavo import LLM

    d = write_config(cfg, tmp, tag)
    t = time.perf_counter()
    llm = LLM(model=d, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, seed=0, **kw)
    return llm, time.perf_counter() - t


def gen_timed(llm, prompts, params) -> tuple[float, list]:
    _sync()
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    _sync()
    return time.perf_counter() - t, outs
