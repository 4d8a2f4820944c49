"""The grammar mask applied on an accelerator (core/grammar_step.py ``apply_packed``: packed int32 rows copied
host -> device through pinned memory, non_blocking, then the CUDA platform's one Triton launch
(plugins/platforms/cuda_grammar_mask.py, ``Platform.make_grammar_mask_apply``) or the
byte-table add on the device) gives exactly the
logits of the host path, on random masks: every row, a subset of rows (``index_add_``), fp32 and bf16, a
vocabulary that is not a multiple of 32, from a pageable and from an already pinned buffer, and greedy picks
of the masked logits are equal. Skipped without CUDA (benchmarks/device/structured.sh runs it on the H100)."""

from __future__ import annotations

import pytest
import torch

from octavo.core import grammar_step
from octavo.core.grammar_step import apply_packed
from octavo.plugins.platforms.cuda import CudaPlatform

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("vocab", [49152, 1000 * 32 + 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [None, [1, 4, 5]])
@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("triton", [True, False])
def test_device_apply_equals_host_apply(vocab, dtype, rows, pinned, triton, monkeypatch):
    monkeypatch.setattr(grammar_step, "PLATFORM_APPLY", triton)
    if triton:
        pytest.importorskip("triton")
    g = torch.Generator().manual_seed(vocab + len(rows or []))
    n = 6
    logits = torch.randn(n, vocab, generator=g).to(dtype)
    rows = rows or list(range(n))
    packed = torch.randint(-2**31, 2**31 - 1, (len(rows), (vocab + 31) // 32), dtype=torch.int32, generator=g)
    packed[0, :] = -1  # one row fully open
    if pinned:
        packed = packed.pin_memory()
    kernel = CudaPlatform().make_grammar_mask_apply()
    assert kernel is not None or not triton
    host = apply_packed(logits.clone(), rows, packed)
    dev = apply_packed(logits.to("cuda"), rows, packed, kernel=kernel)
    torch.cuda.synchronize()
    assert dev.device.type == "cuda"
    assert torch.equal(dev.cpu(), host)
    assert torch.equal(dev.argmax(-1).cpu(), host.argmax(-1))
