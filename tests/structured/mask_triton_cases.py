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


def test_device_wait_goes_on_once_the_host_opened_and_gives_up_after_its_spins():
    """The device gate's wait (plugins/platforms/cuda_grammar_mask.py ``_wait_flag_kernel``): returns at once on an
    open word, waits for a word another thread opens, and after ``MAX_SPINS`` reads records the step it gave up on;
    the volatile apply gives the same bits as the plain one."""
    import threading
    import time

    from octavo.plugins.platforms.cuda_grammar_mask import _wait_flag_kernel, apply_bitmask_

    words = torch.zeros(2, dtype=torch.int32)
    words[0] = 5
    _wait_flag_kernel[(1,)](words, 5, 100)
    assert words.tolist() == [5, 0]
    _wait_flag_kernel[(1,)](words, 7, 100)  # never opened: gives up, says so
    assert words.tolist() == [5, 7]
    words[:] = 0
    opener = threading.Timer(0.1, lambda: words.__setitem__(0, 3))
    opener.start()
    t0 = time.perf_counter()
    _wait_flag_kernel[(1,)](words, 3, 1 << 30)
    assert time.perf_counter() - t0 >= 0.09 and words.tolist() == [3, 0]
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 1000, generator=g)
    packed = torch.randint(-2**31, 2**31 - 1, (4, 32), dtype=torch.int32, generator=g)
    assert torch.equal(apply_bitmask_(logits.clone(), packed, None, volatile=True),
                       apply_bitmask_(logits.clone(), packed, None))


def test_graph_wait_reads_its_step_from_memory():
    """The graph form of the wait (``_wait_dev_kernel``, GatedApplyGraphs, session 12): the step number is read from
    a tensor (the graph's device word), with the same open / give-up behaviour as the argument form."""
    from octavo.plugins.platforms.cuda_grammar_mask import _wait_dev_kernel

    words, seq = torch.zeros(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    words[0], seq[0] = 5, 5
    _wait_dev_kernel[(1,)](words, seq, 100)
    assert words.tolist() == [5, 0]
    seq[0] = 7
    _wait_dev_kernel[(1,)](words, seq, 100)  # never opened: gives up, says so
    assert words.tolist() == [5, 7]


def test_cuda_apply_offers_the_device_wait():
    from octavo.plugins.platforms.cuda_grammar_mask import apply_bitmask_, wait_host_flag

    assert apply_bitmask_.wait_host_flag is wait_host_flag and apply_bitmask_.reads_pinned_host
    assert apply_bitmask_.gated_graphs.replays == 0  # (the graph form: GRAPH, opt-in; captured on first use)

