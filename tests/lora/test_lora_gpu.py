"""LoRA in CUDA graphs (GPU only, ``gpu`` marker; skipped without CUDA).

1. Op level: the static ops (dense torch, dense with the Triton masked expand, fixed-grid Triton SGMV,
   octavo.lora.static) captured once in a
   CUDA graph and replayed for several adapter mixes written into the buffers in between: each replay equals an
   eager call of the same op bit for bit, and the float64 oracle within bf16/fp32 tolerance.
2. Engine level: a tiny random Llama in fp32 with 4 PEFT adapters mixed with the base model in one batch: decode
   steps that carry adapters now REPLAY graphs (counted), and every request's greedy tokens equal an
   ``enforce_eager`` engine's and, where peft is installed, transformers + peft (both graph ops).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("LoRA CUDA-graph tests need a CUDA GPU", allow_module_level=True)

from octavo.lora.ops import lora_reference  # noqa: E402
from octavo.lora.static import StaticLoRA  # noqa: E402
from tests.lora.inputs import flat_weights as weights  # noqa: E402

# adapter mixes replayed in one graph of 64 rows (a shorter mix leaves base-model padding rows)
MIXES = [[i % 8 for i in range(64)], [-1] * 64, [3] * 10 + [-1] * 30 + [7] * 24, [5, -1] * 20, [0] * 64, [2, 6] * 5]


@pytest.mark.parametrize("op", ["dense", "triton", "fused", "triton_tuned"])
@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 3e-2), (torch.float32, 1e-4)])
def test_replayed_op_equals_eager(op, dtype, tol):
    """``triton_tuned``: session 5's launch options (many K splits, parts-only expand over a block-diagonal B, the
    persistent shrink buffer zeroed by ``write``)."""
    if op != "dense":
        pytest.importorskip("triton")
    use_triton = op.startswith("triton")
    dev = torch.device("cuda")
    k, o, r, size = 4096, 6144, 48, 64  # the fused q/k/v of a Llama-3-8B shape, 3 x rank 16
    parts = [0, 4096, 5120] if op == "triton_tuned" else None
    if op == "triton_tuned":
        triton_ops = _kernels()
        triton_ops.set_config(k_per_split=128, part_expand=1, static_h=1)
    try:
        _replay_mixes(op, dtype, tol, use_triton, dev, k, o, r, size, parts)
    finally:
        if op == "triton_tuned":
            _kernels().load_env_config()


def _kernels():
    from octavo.plugins.platforms.cuda import CudaPlatform

    return CudaPlatform().make_lora_kernels()  # plugins/platforms/cuda_lora.py


def _replay_mixes(op, dtype, tol, use_triton, dev, k, o, r, size, parts):
    a, b, b_flat = (t.to(dev) for t in weights(8, k, o, r, dtype, parts=parts))
    static = StaticLoRA(8, size, dtype, dev, _kernels() if op != "dense" else None, fused_expand=op == "fused")
    static.reserve_h(1, r)
    key = 0 if static.h_all is not None else None
    x = torch.randn(size, k, device=dev).to(dtype)
    y0 = torch.randn(size, o, device=dev).to(dtype)
    y = y0.clone()
    static.apply(x, y, a, b, b_flat, parts, key)  # warm-up outside the graph (Triton compiles, cuBLAS picks kernels)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y.copy_(y0)
        static.apply(x, y, a, b, b_flat, parts, key)
    for mix in MIXES:
        ts = torch.tensor(mix)
        static.write(None if (ts < 0).all() else ts, len(mix))
        graph.replay()
        static.write(None if (ts < 0).all() else ts, len(mix))  # (static_h: the replay's sums zeroed again)
        eager = static.apply(x, y0.clone(), a, b, b_flat, parts, key)
        torch.cuda.synchronize()
        want = lora_reference(x.cpu(), y0.cpu(), a.cpu(), b.cpu(), torch.cat([ts, torch.full((size - len(mix),), -1)]))
        scale = max(1.0, want.abs().max().item())
        if use_triton:  # split-K sums with fp32 atomics: the order (last bits) may differ between two runs
            assert (y - eager).abs().max().item() <= tol * scale, mix[:8]
        else:
            assert torch.equal(y, eager), mix[:8]
        assert (y.cpu().double() - want).abs().max().item() <= tol * scale, mix[:8]


def write_adapter(base: str, path: str, rank: int, alpha: int, targets: list[str], seed: int) -> None:
    """A PEFT-format LoRA adapter written without peft (the GPU machine may not have it): random A/B
    (std 0.15, as tests/lora/conftest.make_adapter) on ``targets`` of every layer; ``embed_tokens`` gets PEFT's
    ``lora_embedding_A [r, vocab]`` / ``lora_embedding_B [hidden, r]``."""
    import json
    import os

    from safetensors.torch import save_file

    from tests.lora.conftest import TINY

    h, inter, vocab = TINY["hidden_size"], TINY["intermediate_size"], TINY["vocab_size"]
    kv = h // TINY["num_attention_heads"] * TINY["num_key_value_heads"]
    dims = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h), "gate_proj": (h, inter),
            "up_proj": (h, inter), "down_proj": (inter, h)}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in targets:
        if name == "embed_tokens":
            key = "base_model.model.model.embed_tokens"
            tensors[f"{key}.lora_embedding_A"] = torch.randn(rank, vocab, generator=gen) * 0.15
            tensors[f"{key}.lora_embedding_B"] = torch.randn(h, rank, generator=gen) * 0.15
            continue
        d_in, d_out = dims[name]
        for layer in range(TINY["num_hidden_layers"]):
            key = f"base_model.model.model.layers.{layer}.{'self_attn' if name[0] in 'qkvo' else 'mlp'}.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, d_in, generator=gen) * 0.15
            tensors[f"{key}.lora_B.weight"] = torch.randn(d_out, rank, generator=gen) * 0.15
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": targets}, f)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Base + the 5 adapters of tests/lora/conftest.ADAPTERS (written by peft when it is installed, and then
    its greedy tokens are the reference too; else written directly, and the eager engine is the reference)."""
    from octavo.lora.request import LoRARequest
    from tests.lora.conftest import ADAPTERS, make_adapter, make_base, peft_greedy
    from tests.lora.test_lora_llama import PROMPTS, N

    try:
        import peft  # noqa: F401
    except ImportError:
        peft = None
    root = tmp_path_factory.mktemp("lora_gpu")
    base = str(root / "base")
    make_base(base)
    loras, want = [], ({None: peft_greedy(base, None, PROMPTS, N)} if peft else None)
    for i, (rank, alpha, rslora, targets) in enumerate(ADAPTERS):
        path = str(root / f"adapter{i}")
        if peft:
            make_adapter(base, path, rank, alpha, rslora, targets, seed=100 + i)
            want[i + 1] = peft_greedy(base, path, PROMPTS, N)
        else:
            write_adapter(base, path, rank, alpha * (rank ** 0.5 if rslora else 1), targets, seed=100 + i)
        loras.append(LoRARequest(f"a{i}", i + 1, path))
    return base, loras, want


def _engine(base, **kw):
    from octavo import LLM

    return LLM(base, dtype="float32", skip_tokenizer_init=True, enable_lora=True, max_loras=5, max_lora_rank=16,
               kv_cache_memory_bytes=64 << 20, max_model_len=256, block_size=16, seed=0, max_num_seqs=16, **kw)


def _mixed(llm, loras):
    from octavo import SamplingParams
    from tests.lora.test_lora_llama import PROMPTS, N

    choices = [None, *loras, *loras[::-1], None, loras[0]]
    prompts = [{"prompt_token_ids": PROMPTS[i % len(PROMPTS)]} for i in range(len(choices))]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True), use_tqdm=False,
                        lora_request=choices)
    return choices, [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("kernel", ["auto", "torch", "triton", "fused"])
def test_engine_graphs_with_adapters_equal_peft_and_eager(tiny, kernel, monkeypatch):
    from tests.lora.test_lora_llama import PROMPTS

    if kernel in ("triton", "fused"):
        pytest.importorskip("triton")
    monkeypatch.setenv("OCTAVO_LORA_KERNEL", kernel)
    base, loras, want = tiny
    llm = _engine(base)
    runner = llm.llm_engine.core.executor.driver.runner
    assert runner.graph_runner is not None and runner.lora.static.captured
    before = runner.graph_runner.num_replays
    choices, got = _mixed(llm, loras)
    replays = runner.graph_runner.num_replays - before
    llm.llm_engine.shutdown()
    assert replays > 0  # decode steps with adapters ran as graphs, not eager
    assert len({tuple(t) for t in got}) > 3  # the adapters changed the outputs
    if want is not None:  # peft installed: its tokens are the reference
        for i, (lora, tokens) in enumerate(zip(choices, got)):
            assert tokens == want[None if lora is None else lora.lora_int_id][i % len(PROMPTS)], (kernel, i, lora)
    if kernel == "auto" or want is None:  # the eager per-step layouts (checked against peft on CPU)
        eager = _engine(base, enforce_eager=True)
        _, got_eager = _mixed(eager, loras)
        eager.llm_engine.shutdown()
        assert got == got_eager
