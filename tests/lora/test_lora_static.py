"""The graph-capturable LoRA op (octavo.lora.static) against the float64 oracle, on CPU: the dense op (pure
torch) over whole padded batches whose buffers are rewritten between calls (a new mix, fewer tokens, base only:
rows past the step must read as base), the embedding form, and the Triton forms (fixed-grid SGMV, dense with
the masked expand) under ``TRITON_INTERPRET=1`` (a subprocess). On a GPU, tests/lora/test_lora_gpu.py replays them in CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from octavo.lora.ops import lora_reference
from octavo.lora.static import StaticLoRA
from tests.lora.inputs import flat_weights as weights
from tests.utils import run_triton_interpreted

# (token slots of a step, rows of the padded batch the graph runs)
STEPS = [([0, 1, 2, 3, 0, 1, 2, 3], 8), ([1, -1, 0, -1, 1, 0, 0, -1, 1, 0], 16), ([3, -1, 5, 3], 8),
         ([-1, -1], 4), ([i % 6 for i in range(40)], 48), ([2] * 20, 24), ([5], 1)]


def run_steps(static, a, b, b_flat, k, o, dtype, tol, device="cpu", parts=None, key=None):
    gen = torch.Generator().manual_seed(1)
    for slots, size in STEPS:
        n = len(slots)
        ts = torch.tensor(slots)
        assert static.write(None if (ts < 0).all() else ts, n)
        x = torch.randn(size, k, generator=gen).to(dtype)
        y = torch.randn(size, o, generator=gen).to(dtype)
        padded = torch.cat([ts, torch.full((size - n,), -1)])  # rows past the step: base
        want = lora_reference(x, y, a, b, padded)
        got = static.apply(x.to(device), y.clone().to(device), a.to(device), b.to(device), b_flat.to(device),
                           parts, key).cpu()
        err = (got.double() - want).abs().max().item()
        assert err <= tol * max(1.0, want.abs().max().item()), (slots, err)


def test_dense_op_matches_reference_as_buffers_are_rewritten():
    static = StaticLoRA(6, 48, torch.float32, "cpu")
    a, b, b_flat = weights(6, 24, 20, 8)
    run_steps(static, a, b, b_flat, 24, 20, torch.float32, 1e-5)
    assert static.write(torch.tensor([0] * 49), 49) is False  # more tokens than any captured graph


def test_dense_op_bfloat16_layers_float32_adapters():
    static = StaticLoRA(6, 48, torch.float32, "cpu")
    a, b, b_flat = weights(6, 32, 16, 8)
    ts = torch.tensor([0, -1, 5, 5])
    static.write(ts, 4)
    x, y = torch.randn(4, 32).bfloat16(), torch.randn(4, 16).bfloat16()
    got = static.apply(x, y.clone(), a, b, b_flat)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), lora_reference(x, y, a, b, ts), rtol=2e-2, atol=2e-2)


def test_embedding_form():
    static = StaticLoRA(4, 16, torch.float32, "cpu")
    vocab, hidden, r = 30, 12, 4
    a, b, b_flat = weights(4, vocab, hidden, r)
    ids, ts = torch.tensor([3, 7, 7, 29, 0]), torch.tensor([1, -1, 3, 0, 1])
    static.write(ts, 5)
    y = torch.randn(5, hidden)
    got = static.apply_embedding(ids, y.clone(), a, b_flat)
    onehot = torch.nn.functional.one_hot(ids, vocab).double()  # the embedding lookup as a product
    torch.testing.assert_close(got.double(), lora_reference(onehot, y, a, b, ts), rtol=1e-6, atol=1e-6)


SCRIPT = r"""
import torch
from octavo.lora.static import StaticLoRA
from octavo.plugins.platforms.cuda import CudaPlatform
triton_ops = CudaPlatform().make_lora_kernels()  # the platform's LoRA kernels (plugins/platforms/cuda_lora.py)
from tests.lora.inputs import flat_weights
from tests.lora.test_lora_static import run_steps
for k, o, r, dtype, tol in [(24, 20, 8, torch.float32, 1e-5), (1100, 40, 48, torch.float32, 1e-4),
                            (64, 24, 16, torch.float16, 3e-3)]:
    a, b, b_flat = flat_weights(6, k, o, r, dtype)
    for kw in ({"kernels": triton_ops}, {"kernels": triton_ops, "fused_expand": True}):  # fixed-grid SGMV; dense with the masked expand
        run_steps(StaticLoRA(6, 48, dtype, "cpu", **kw), a, b, b_flat, k, o, dtype, tol)
triton_ops.set_config(k_per_split=0, static_h=0)  # session 4's launch rule, a fresh h per call
a, b, b_flat = flat_weights(6, 1100, 40, 48)
run_steps(StaticLoRA(6, 48, torch.float32, "cpu", kernels=triton_ops), a, b, b_flat, 1100, 40, torch.float32, 1e-4)
# the tuned SGMV launch config: many K splits, parts-only expand on a block-diagonal q/k/v-like B
# and the persistent shrink buffer that write() zeroes once per step (static_h; key = the projection's buffer)
triton_ops.set_config(k_per_split=64, block_n=16, part_expand=1, static_h=1)
a, b, b_flat = flat_weights(6, 96, 64, 24, parts=[0, 32, 48])
static = StaticLoRA(6, 48, torch.float32, "cpu", kernels=triton_ops)
static.reserve_h(3, 32)
assert static.h_all is not None
run_steps(static, a, b, b_flat, 96, 64, torch.float32, 1e-4, parts=[0, 32, 48], key=1)
assert static.h_all[0].abs().sum() == 0 and static.h_all[1].abs().sum() > 0
print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter check is for CPU machines; "
                    "tests/lora/test_lora_gpu.py checks the compiled kernels in graphs")
def test_fixed_grid_triton_interpreted():
    pytest.importorskip("triton")
    run_triton_interpreted(SCRIPT)


def test_engine_through_the_graph_ops_equals_eager(tmp_path, monkeypatch):
    """The manager's graph path end to end on CPU: a manager built as on CUDA (static buffers, flat B) whose hooks
    run the static ops on EVERY step (as if each were being captured; graph_tokens covers the prefill too), fed by
    ``prepare``'s buffer writes: a batch mixing 3 adapters (one with an embedding LoRA) and the base model gives
    the tokens of the eager per-step layouts (which tests/lora/test_lora_llama.py checks against peft)."""
    import octavo.lora.manager as manager
    from octavo import LLM, SamplingParams
    from octavo.lora.request import LoRARequest
    from tests.lora.conftest import ADAPTERS, make_adapter, make_base

    base = str(tmp_path / "base")
    make_base(base)
    loras = []
    for i in (0, 2, 4):  # all seven projections; q/v only; embedding + q + down
        make_adapter(base, str(tmp_path / f"a{i}"), *ADAPTERS[i], seed=100 + i)
        loras.append(LoRARequest(f"a{i}", i + 1, str(tmp_path / f"a{i}")))
    llm = LLM(base, dtype="float32", skip_tokenizer_init=True, enable_lora=True, max_loras=3, max_lora_rank=16,
              kv_cache_memory_bytes=16 << 20, max_model_len=128, block_size=8, seed=0)
    choices = [None, *loras, loras[1], None, loras[0]]
    prompts = [{"prompt_token_ids": [5 + i, 9, 30 + 2 * i, 7] * (1 + i % 3)} for i in range(len(choices))]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    def run():
        outs = llm.generate(prompts, params, use_tqdm=False, lora_request=choices)
        return [list(o.outputs[0].token_ids) for o in outs]

    eager = run()
    runner = llm.llm_engine.core.executor.driver.runner
    monkeypatch.setattr(manager, "_graphs_on", lambda device: True)
    monkeypatch.setattr(manager.LoRAManager, "_capturing", lambda self: self.static is not None)
    graphs = manager.LoRAManager(runner.model, llm.llm_engine.settings.lora, torch.float32, torch.device("cpu"),
                                 graph_tokens=256)  # (the first manager's hooks stay, idle: it is never prepared)
    assert graphs.static is not None and graphs.projections["model.layers.0.self_attn.qkv_proj"].b_flat is not None
    graphs.static.captured = True
    runner.lora.clear()  # the first manager's hooks now return at once
    runner.lora = graphs
    got = run()
    llm.llm_engine.shutdown()
    assert got == eager
    assert len({tuple(t) for t in got}) > 2  # the adapters changed the outputs


ENGINE_SCRIPT = r"""
import sys, tempfile
import torch
import octavo.lora.manager as manager
from octavo import LLM, SamplingParams
from octavo.plugins.platforms.cuda import CudaPlatform
triton_ops = CudaPlatform().make_lora_kernels()  # the platform's LoRA kernels (plugins/platforms/cuda_lora.py)
from octavo.lora.request import LoRARequest
from tests.lora.conftest import ADAPTERS, make_adapter, make_base

tmp = tempfile.mkdtemp()
make_base(f"{tmp}/base")
loras = []
for i in (0, 2, 4):  # all seven projections; q/v only; embedding + q + down
    make_adapter(f"{tmp}/base", f"{tmp}/a{i}", *ADAPTERS[i], seed=100 + i)
    loras.append(LoRARequest(f"a{i}", i + 1, f"{tmp}/a{i}"))
llm = LLM(f"{tmp}/base", dtype="float32", skip_tokenizer_init=True, enable_lora=True, max_loras=3, max_lora_rank=16,
          kv_cache_memory_bytes=16 << 20, max_model_len=128, block_size=8, seed=0)
choices = [None, *loras, loras[1], None, loras[0]]
prompts = [{"prompt_token_ids": [5 + i, 9, 30 + 2 * i, 7] * (1 + i % 3)} for i in range(len(choices))]  # 52 tokens
params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
run = lambda: [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False,
                                                                  lora_request=choices)]
eager = run()
runner = llm.llm_engine.core.executor.driver.runner
manager._graphs_on = lambda device: True
manager._kernel_choice = lambda device, kernels=None: "auto"  # graphs: the SGMV op
manager.LoRAManager._capturing = lambda self: self.static is not None
triton_ops.set_config(k_per_split=64, block_n=16, part_expand=1, static_h=1)  # tiny q/k/v 64/32/32: parts
graphs = manager.LoRAManager(runner.model, llm.llm_engine.settings.lora, torch.float32, torch.device("cpu"),
                             graph_tokens=64, kernels=triton_ops)
assert graphs.static.use_triton and graphs.static.h_all is not None
graphs.static.captured = True
runner.lora.clear()
runner.lora = graphs
got = run()
llm.llm_engine.shutdown()
assert got == eager, (got, eager)
assert len({tuple(t) for t in got}) > 2
print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter check is for CPU machines; "
                    "benchmarks/lora_gpu.py --parity checks replayed graphs on a GPU")
def test_engine_through_the_sgmv_op_interpreted():
    """As above with the manager's SGMV graph op (Triton, interpreted): every step's LoRA through the fixed-grid
    kernels with part_expand, the per-projection static_h buffers (keys) and write()'s per-step zeroing; ~35 s."""
    pytest.importorskip("triton")
    run_triton_interpreted(ENGINE_SCRIPT, timeout=600)
