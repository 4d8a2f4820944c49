"""The rotary inside the batch-1 fp8 attention (plugins/quant/fp8_attn_rope.py, ``OCTAVO_FP8_ATTN_ROPE``).

CPU (Triton interpreter, child process): a loader-built 2-layer fp8 Llama on the ``triton`` backend with an e4m3 KV
cache and the one-launch attention: with the wrapper on, each one-token decode step of one request runs one fused
launch per layer (and no rotary kernel there), and the decode logits equal the wrapper-off logits bit for bit (four
steps, each reading the K/V the fused launches wrote before); prefills and a two-request step keep the layer's own
forward. A mutation (cos and sin swapped) changes the logits. The kernel's own checks (vs the rotary kernel + the plain launch: output and cache
bytes; sm_90 PTX) are in test_fp8_decode_one.py, compiled on a GPU under the ``gpu`` marker.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

ENGINE = r"""
import os
import torch
from octavo.plugins.attention import _fp8_kv_decode_bs1 as one_mod
from octavo.plugins.attention.triton import TritonAttentionBackend
from octavo.plugins.platforms import cuda_fusions
from octavo.plugins.platforms.cuda_fusions import fuse_model
from octavo.plugins.quant import fp8_attn_rope
from tests.quant.fp8_tiny_llama import tiny_fp8_llama
from octavo.testing.model import PagedRunner

MUTATE = os.environ.get("ATTN_ROPE_MUTATE", "")
os.environ["OCTAVO_FP8_DECODE_ONE"] = "1"
one_mod.DEFAULT_LAUNCH.update(deq=0, block_n=16)  # the interpreter runs no inline PTX (deq 3)


model = tiny_fp8_llama(2, one_row_gemv=True)
fuse_model(model, torch.bfloat16, torch.device("cpu"))
assert fp8_attn_rope.install(model) == 2
runner = PagedRunner(model, TritonAttentionBackend, num_blocks=16, device="cpu", kv_dtype=torch.float8_e4m3fn)
fused, rotary = [], []
real_one, real_rot = one_mod.fp8_decode_one, cuda_fusions.rotary


def spy_one(*a, **k):
    if k.get("rope") is not None:
        fused.append(1)
        if MUTATE == "swap":
            pos, c, s = k["rope"]
            k["rope"] = (pos, s, c)
    return real_one(*a, **k)


one_mod.fp8_decode_one = spy_one
cuda_fusions.rotary = lambda *a, **k: (rotary.append(1), real_rot(*a, **k))[1]
results = {}
with torch.inference_mode():
    runner.prompts([[1, 5, 9, 33, 70]])  # the discovery forward
    for run, on in enumerate((False, True, False)):
        fp8_attn_rope.ON = on
        key = ("a", run)
        fused.clear(), rotary.clear()
        runner.step([(key, [3, 7, 11])])  # a prefill: the layer's own forward
        assert not fused, "prefill took the fused path"
        got = [runner.step([(key, [t])])[0] for t in (42, 17, 99, 5)]  # one-token decode steps
        two = runner.step([(key, [8]), (("b", run), [4, 6])])  # two requests: the layer's own forward
        assert len(fused) == (8 if on else 0) and len(rotary) == (2 + 2 + (0 if on else 8)), (on, fused, rotary)
        results[run] = (got, two)
        runner.free(key)
        runner.free(("b", run))
same = all(torch.equal(a, b) for a, b in zip(results[0][0], results[1][0])) and torch.equal(results[0][1][0], results[1][1][0])
assert all(torch.equal(a, b) for a, b in zip(results[0][0], results[2][0]))
if MUTATE:
    assert not same, "the mutation went unnoticed"
    print("mutation caught")
else:
    assert same, "wrapper on: other logits"
print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter check for CPU machines; on a GPU the compiled kernel is tested")
@pytest.mark.parametrize("mutate", ["", "swap"])
def test_attn_rope_engine_same_logits_interpreted(mutate):
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(ENGINE, timeout=900, ATTN_ROPE_MUTATE=mutate)
