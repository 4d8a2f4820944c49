"""``octavo.nn`` layers: norms, activations and rotary embeddings against transformers' own modules, and
tensor parallelism (2 CPU processes over gloo) giving the same logits as one process, KV-head replication
included."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

from octavo.nn import RMSNorm, SiluAndMul, get_rope


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_transformers_and_fuses_residual(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    ref = LlamaRMSNorm(64, eps=1e-5).to(dtype)
    ref.weight.data.normal_(1, 0.1)
    ours = RMSNorm(64, eps=1e-5).to(dtype)
    ours.weight.data.copy_(ref.weight)
    x, res = torch.randn(5, 64, dtype=dtype), torch.randn(5, 64, dtype=dtype)
    torch.testing.assert_close(ours(x), ref(x))
    out, new_res = ours(x, res)
    torch.testing.assert_close(new_res, x + res)
    torch.testing.assert_close(out, ref(x + res))


def test_silu_and_mul():
    x = torch.randn(3, 8)
    torch.testing.assert_close(SiluAndMul()(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:])


@pytest.mark.parametrize("params", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
])
def test_rotary_matches_transformers(params):
    """cos/sin and the rotation equal transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=256,
                         rope_parameters=dict(params))
    ref = LlamaRotaryEmbedding(config)
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if params["rope_type"] == "default":
        scaling = None
    else:
        scaling.setdefault("original_max_position_embeddings", 256)
    rope = get_rope(64, 512, params["rope_theta"], scaling)
    positions = torch.tensor([0, 1, 5, 63, 64, 200, 255])
    q, k = torch.randn(len(positions), 4 * 64), torch.randn(len(positions), 2 * 64)
    cos, sin = ref(q, positions[None])
    q_ref, k_ref = apply_rotary_pos_emb(q.view(1, -1, 4, 64).transpose(1, 2), k.view(1, -1, 2, 64).transpose(1, 2),
                                        cos, sin)
    q_out, k_out = rope(positions, q, k)
    torch.testing.assert_close(q_out.view(-1, 4, 64), q_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out.view(-1, 2, 64), k_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ tensor parallel

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp_worker(rank: int, world: int, port: int, ckpt: str, prompts, queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        from octavo.config import ModelSettings
        from octavo.core.loader import load_model, resolve_model
        from octavo.plugins.models.llama import LlamaForCausalLM
        from octavo.testing.model import PagedRunner

        model = load_model(resolve_model(ModelSettings(model=ckpt)), model_cls=LlamaForCausalLM,
                           dtype=torch.float32, device="cpu")
        attn = model.model.layers[0].self_attn
        logits = PagedRunner(model, block_size=4).prompts(prompts)
        queue.put((rank, attn.num_heads, attn.num_kv_heads, [x.tolist() for x in logits]))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("num_kv_heads", [2, 1])  # 1: the single KV head is replicated on both ranks
def test_tensor_parallel_two_ranks_match_one(tmp_path, num_kv_heads):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from octavo.config import ModelSettings
    from octavo.core.loader import load_model, resolve_model
    from octavo.plugins.models.llama import LlamaForCausalLM
    from octavo.testing.model import PagedRunner, randomize_

    config = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=num_kv_heads, max_position_embeddings=64,
                         architectures=["LlamaForCausalLM"], tie_word_embeddings=num_kv_heads == 1)
    ref = randomize_(AutoModelForCausalLM.from_config(config))
    ref.save_pretrained(tmp_path)
    prompts = [[1, 5, 9, 2, 7, 3], [4, 4, 8]]
    single = load_model(resolve_model(ModelSettings(model=str(tmp_path))), model_cls=LlamaForCausalLM,
                        dtype=torch.float32, device="cpu")
    expected = PagedRunner(single, block_size=4).prompts(prompts)

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_tp_worker, args=(r, 2, port, str(tmp_path), prompts, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for rank, num_heads, kv_heads, logits in results:
        assert (num_heads, kv_heads) == (2, 1), f"rank {rank} must hold half the query heads and one KV head"
        for got, want in zip(logits, expected):
            torch.testing.assert_close(torch.tensor(got), want, atol=1e-5, rtol=1e-5)
