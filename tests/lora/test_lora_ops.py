"""The batched LoRA op against a token-by-token float64 oracle: every torch layout (single / padded / loop, with
and without base-model tokens, slots that are not a prefix), the Triton kernels under ``TRITON_INTERPRET=1`` on
CPU at tiny shapes (a subprocess: the interpreter is chosen when the kernels are decorated; fp32 and fp16, since
the interpreter's ``tl.dot`` on bf16 returns garbage even for a bare 16x16 product), and the compiled kernels on
a GPU, bf16 included (``gpu`` marker)."""

from __future__ import annotations

import pytest
import torch

import octavo.lora.ops as ops
from octavo.lora.ops import lora_reference, lora_shrink_expand, plan_tokens
from tests.lora.inputs import lora_data
from tests.utils import run_triton_interpreted

CPU = torch.device("cpu")
# (token slots, the mode plan_tokens picks)
CASES = [
    ([2] * 5, "single"),
    ([0, 1, 2, 3, 0, 1, 2, 3], "padded"),  # decode-like: one token per request
    ([1, -1, 0, -1, 1, 0, 0, -1, 1, 0], "padded"),  # base tokens read a zeroed padding row
    ([3, -1, 5, 3, -1, 5, 3, 5], "padded"),  # slots 3 and 5: not a prefix, weights gathered
    ([0, 1, 2] * 4 + [2] * 60, "loop"),  # many short runs, one slot far longer: padding would waste > 2x
    ([0] * 1 + [-1] * 2 + [1] * 40 + [2], "runs"),  # a prefill chunk next to decodes
    ([0] * 6 + [1] * 6, "runs"),
    ([0] * 20 + [1] * 20 + [0] * 20 + [-1] * 20 + [2] * 20 + [1] * 20, "padded"),  # 5 runs > S: gathered
]


def test_no_adapter_tokens_means_no_plan():
    assert plan_tokens(torch.tensor([-1, -1, -1]), CPU) is None
    x, y, a, b = lora_data(3, 8, 4, 2)
    assert lora_shrink_expand(x, y, a, b, None) is y


@pytest.mark.parametrize("slots,mode", CASES)
def test_torch_layouts_match_reference(slots, mode):
    ts = torch.tensor(slots)
    plan = plan_tokens(ts, CPU)
    assert plan.mode == mode
    x, y, a, b = lora_data(len(slots), 24, 20, 8)
    want = lora_reference(x, y, a, b, ts)
    got = lora_shrink_expand(x, y.clone(), a, b, plan)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("slots,_", CASES[1:])
def test_loop_and_padded_agree_when_forced(slots, _, monkeypatch):
    """Both gathering layouts on the same tokens (USE_RUNS and PAD_WASTE force the choice)."""
    ts = torch.tensor(slots)
    x, y, a, b = lora_data(len(slots), 16, 12, 4, seed=1)
    want = lora_reference(x, y, a, b, ts)
    monkeypatch.setattr(ops, "USE_RUNS", False)
    for waste, mode in [(1e9, "padded"), (-1e9, "loop")]:
        monkeypatch.setattr(ops, "PAD_WASTE", waste)
        plan = plan_tokens(ts, CPU)
        assert plan.mode == mode
        torch.testing.assert_close(lora_shrink_expand(x, y.clone(), a, b, plan).double(), want, rtol=1e-5, atol=1e-5)


def test_bfloat16_layers_with_float32_adapters():
    """``lora_dtype`` differing from the model dtype: computed in the LoRA dtype, added in the layer's."""
    ts = torch.tensor([0, -1, 1, 1])
    x, y, a, b = lora_data(4, 32, 16, 8)
    want = lora_reference(x.bfloat16(), y.bfloat16(), a, b, ts)
    got = lora_shrink_expand(x.bfloat16(), y.bfloat16(), a, b, plan_tokens(ts, CPU))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


SCRIPT = r"""
import torch
from octavo.lora.ops import lora_reference, lora_shrink_expand, plan_tokens
from octavo.plugins.platforms.cuda import CudaPlatform
triton_ops = CudaPlatform().make_lora_kernels()  # the platform's LoRA kernels (plugins/platforms/cuda_lora.py)
from tests.lora.inputs import lora_data
from tests.lora.test_lora_ops import CASES
for slots, _ in CASES:
    ts = torch.tensor(slots)
    for k, o, r, dtype, tol, cfg, parts in [
            (24, 20, 8, torch.float32, 1e-5, {}, None), (1100, 40, 48, torch.float32, 1e-4, {}, None),
            (1100, 40, 48, torch.float32, 1e-4, {"k_per_split": 0, "block_n": 32}, None),  # session 4's splits
            # q/k/v-like parts: the expand reads each part's rank columns only (B block-diagonal)
            (96, 64, 24, torch.float32, 1e-4, {"k_per_split": 64, "block_n": 16, "part_expand": 1}, [0, 32, 48]),
            (64, 24, 16, torch.float16, 3e-3, {}, None)]:  # (the interpreter's bf16 tl.dot is wrong)
        triton_ops.load_env_config()
        triton_ops.set_config(**cfg)
        x, y, a, b = lora_data(len(slots), k, o, r, dtype=dtype, parts=parts)
        plan = plan_tokens(ts, torch.device("cpu"), kernels=triton_ops)
        assert plan.triton is not None
        got = lora_shrink_expand(x, y.clone(), a, b, plan, parts)
        want = lora_reference(x, y, a, b, ts)
        err = (got.double() - want).abs().max().item()
        assert err <= tol * max(1.0, want.abs().max().item()), (slots, k, dtype, err)
print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter check is for CPU machines; "
                    "test_triton_kernels_on_cuda checks the compiled kernels")
def test_triton_kernels_interpreted():
    pytest.importorskip("triton")
    run_triton_interpreted(SCRIPT)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_kernels_on_cuda():
    """The compiled kernels vs the torch layouts on the GPU, bf16 at an 8B-like width (and fp32 small)."""
    pytest.importorskip("triton")
    from octavo.plugins.platforms.cuda import CudaPlatform

    kernels = CudaPlatform().make_lora_kernels()
    dev = torch.device("cuda")
    for slots, _ in CASES + [([i % 8 for i in range(64)], None), ([i // 40 for i in range(300)], None)]:
        ts = torch.tensor(slots)
        for k, o, r, dtype, tol in [(4096, 6144, 48, torch.bfloat16, 3e-2), (96, 40, 16, torch.float32, 1e-4)]:
            x, y, a, b = (t.to(dev) for t in lora_data(len(slots), k, o, r, slots=8, dtype=dtype))
            want = lora_reference(x.cpu(), y.cpu(), a.cpu(), b.cpu(), ts)
            got = lora_shrink_expand(x, y.clone(), a, b, plan_tokens(ts, dev, kernels=kernels)).cpu()
            torch_got = lora_shrink_expand(x, y.clone(), a, b, plan_tokens(ts, dev)).cpu()
            scale = max(1.0, want.abs().max().item())
            assert (got.double() - want).abs().max().item() <= tol * scale, (slots[:8], k, dtype)
            assert (torch_got.double() - want).abs().max().item() <= tol * scale, (slots[:8], k, dtype)
