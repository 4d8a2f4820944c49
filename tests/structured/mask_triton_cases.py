"""Cases for plugins/platforms/cuda_grammar_mask.py (the CUDA platform's grammar mask apply) under Triton's
interpreter (run by test_pipelined_fill.py in a child pytest with ``TRITON_INTERPRET=1``, which must be set
before the kernel is defined): the one-launch apply writes -inf exactly where the host (numpy) apply does, for
every row and for a subset of rows, and the CUDA platform hands out this very apply."""

from __future__ import annotations

import os

import pytest
import torch

from octavo.core.grammar_step import _apply_packed_numpy

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="run under TRITON_INTERPRET=1")


@pytest.mark.parametrize("vocab,dtype", [(49152, torch.float32), (1000, torch.bfloat16), (4097, torch.float16)])
def test_triton_apply_equals_host_apply(vocab, dtype):
    from octavo.plugins.platforms.cuda_grammar_mask import apply_bitmask_

    g = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32
    logits = torch.randn(6, vocab, generator=g).to(dtype)
    packed = torch.randint(-2**31, 2**31 - 1, (6, words), dtype=torch.int32, generator=g)
    packed[2] = -1  # a fully open row stays untouched
    got = apply_bitmask_(logits.clone(), packed, None)
    assert torch.equal(got, _apply_packed_numpy(logits.clone(), list(range(6)), packed))
    assert torch.equal(got[2], logits[2])
    rows = [4, 1, 5]
    got = apply_bitmask_(logits.clone(), packed[:3].contiguous(), torch.tensor(rows, dtype=torch.int32))
    assert torch.equal(got, _apply_packed_numpy(logits.clone(), rows, packed[:3]))
    assert torch.equal(got[0], logits[0])  # rows not listed are untouched


def test_cuda_platform_hands_out_the_triton_apply():
    from octavo.plugins.platforms.cuda import CudaPlatform
    from octavo.plugins.platforms.cuda_grammar_mask import apply_bitmask_

    assert CudaPlatform().make_grammar_mask_apply() is apply_bitmask_
