"""The CPU platform's grammar mask apply (plugins/platforms/cpu_grammar_mask.py, ``CpuPlatform.make_grammar_mask_apply``):
one C pass over the packed words sets exactly the disallowed logits to ``-inf``, bit for bit the core's numpy
apply and a plain numpy reference (fp32, bf16, fp16, fp64; every row and a subset; a vocabulary that is not a
multiple of 32; words of all ones, all zeros and mixed; NaN and inf logits untouched where allowed); bad shapes
are refused; the runner's ``mask_logits`` with the kernel builds no numpy operands on the fill and gives the same
logits; a kernel that fails on first use falls back to the core's apply; and on a CPU the manager never pins its
fill buffer (it asks the platform: no pinned memory). Real SmolLM2 tokenizer and xgrammar where a grammar runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.core import grammar_step
from octavo.core.grammar_step import _apply_packed_numpy, apply_packed
from octavo.plugins.platforms.cpu import CpuPlatform
from octavo.plugins.platforms.cpu_grammar_mask import apply_bitmask_cpu_, unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"no C kernel: {unavailable_reason()}")
INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float64: torch.int64}


def reference(logits: torch.Tensor, rows: list[int], packed: torch.Tensor) -> torch.Tensor:
    words = packed.numpy().view(np.uint32)
    bits = ((words[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(len(rows), -1)
    out = logits.clone()
    for j, r in enumerate(rows):
        out[r, torch.from_numpy(bits[j, :logits.shape[1]] == 0)] = float("-inf")
    return out


def case(vocab: int, dtype: torch.dtype, n_rows: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(8, vocab, generator=g).to(dtype)
    logits[0, 3], logits[1, 5 % vocab], logits[2, vocab - 1] = float("nan"), float("inf"), float("-inf")
    packed = torch.randint(-2**31, 2**31 - 1, (n_rows, (vocab + 31) // 32), dtype=torch.int32, generator=g)
    packed[0, : packed.shape[1] // 2] = 0  # 32 disallowed tokens a word
    packed[min(1, n_rows - 1), 1::3] = -1  # 32 allowed tokens a word
    return logits, packed


@pytest.mark.parametrize("vocab", [49152, 1000 * 32 + 7, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_kernel_equals_reference_and_numpy_apply_bit_for_bit(vocab, dtype):
    for rows in (list(range(8)), [6, 1, 3]):
        logits, packed = case(vocab, dtype, len(rows), vocab + len(rows))
        want = reference(logits, rows, packed)
        index = None if len(rows) == 8 else torch.tensor(rows, dtype=torch.int32)
        got = apply_bitmask_cpu_(logits.clone(), packed, index)
        assert torch.equal(got.view(INT[dtype]), want.view(INT[dtype])), (vocab, dtype, rows)
        numpy_apply = _apply_packed_numpy(logits.clone(), rows, packed)
        assert torch.equal(got.view(INT[dtype]), numpy_apply.view(INT[dtype]))


def test_kernel_refuses_what_it_cannot_read():
    logits, packed = case(64, torch.float32, 2, 0)
    with pytest.raises(ValueError, match="cannot cover"):
        apply_bitmask_cpu_(logits, packed[:, :1].contiguous(), None)
    with pytest.raises(IndexError, match="outside"):
        apply_bitmask_cpu_(logits, packed, torch.tensor([0, 8], dtype=torch.int32))
    with pytest.raises(TypeError, match="no routine"):
        apply_bitmask_cpu_(logits.to(torch.int32), packed, None)
    with pytest.raises(ValueError, match="contiguous"):
        apply_bitmask_cpu_(logits.t(), packed, None)


def test_platform_hands_the_kernel_and_apply_packed_uses_it():
    kernel = CpuPlatform().make_grammar_mask_apply()
    assert kernel is apply_bitmask_cpu_
    logits, packed = case(49152, torch.bfloat16, 3, 7)
    rows = [2, 0, 7]
    assert torch.equal(apply_packed(logits.clone(), rows, packed, kernel=kernel).view(torch.int16),
                       reference(logits, rows, packed).view(torch.int16))


def test_a_failing_kernel_falls_back_to_the_cores_apply(monkeypatch, caplog):
    monkeypatch.setattr(grammar_step, "_TABLES", {})

    def broken(logits, packed, rows):
        raise RuntimeError("no compiler here")

    logits, packed = case(1000, torch.float32, 8, 3)
    with caplog.at_level("WARNING"):
        got = apply_packed(logits.clone(), list(range(8)), packed, kernel=broken)
    assert torch.equal(got, reference(logits, list(range(8)), packed))
    assert "no compiler here" in caplog.text and grammar_step._TABLES["kernel_failed"]
    assert not grammar_step.platform_apply_on(broken)  # later steps go straight to the core's apply


def test_mask_logits_with_the_kernel_builds_no_operands():
    """With the platform's kernel the fill does not build the numpy apply's operands (the work it saves), and
    the manager learns the logits' device (CPU: its buffer stays unpinned; the CPU platform has no pinned memory)."""
    from octavo.config import OctavoSettings
    from octavo.core.loader import load_tokenizer
    from octavo.core.messages import EngineCoreRequest
    from octavo.core.request import Request
    from octavo.core.scheduler import ScheduledRequest
    from octavo.core.structured_output import StructuredOutputManager
    from octavo.sampling_params import SamplingParams
    from octavo.structured_outputs import StructuredOutputsParams

    settings = OctavoSettings.from_kwargs()
    tok = load_tokenizer(settings.model)
    mgr = StructuredOutputManager(settings, 49152, [tok.eos_token_id], CpuPlatform())
    try:
        so = StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}})
        reqs = [Request(EngineCoreRequest(f"k{i}", [1], SamplingParams(structured_outputs=so), 0.0), 64)
                for i in range(3)]
        for r in reqs:
            mgr.add_request(r)
            r.grammar.future.result(timeout=60)

        class Out:
            scheduled = [ScheduledRequest(r, 1, 0, [0]) for r in reqs]

        ids = [r.request_id for r in reqs]
        logits = torch.randn(3, 49152)
        kernel = CpuPlatform().make_grammar_mask_apply()
        want = grammar_step.mask_logits(logits.clone(), None, ids, lambda rows: rows, mgr.prepare(Out))
        mgr.accept_tokens([])
        assert "dtype" in mgr._cpu_hint  # the numpy apply asked for operands
        for _ in range(2):  # the first kernel apply drops that request; the next fill builds none
            step = mgr.prepare(Out)
            step.start()
            got = grammar_step.mask_logits(logits.clone(), None, ids, lambda rows: rows, step, kernel)
            mgr.accept_tokens([])
            assert torch.equal(got, want) and torch.isinf(got).any()
        assert step.cpu_pre is None and "dtype" not in mgr._cpu_hint
        assert mgr._cpu_hint["device"] == "cpu" and not mgr._bitmask.is_pinned()
    finally:
        mgr.shutdown()
