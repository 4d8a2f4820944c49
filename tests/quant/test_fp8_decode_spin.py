"""The one-launch batch-1 fp8 attention's merge by polling (plugins/attention/_fp8_decode_merge.py, ``spin`` 1 / 2):
the same output bits and cache bytes as the ticket merge (``spin=0``), launch after launch with other inputs and
lengths (a reader that did not put the sentinels back would merge the last launch's partials: caught here), the
scratch all sentinels again after each launch, and a float64 reference within 1e-2.

TRITON_INTERPRET=1 in a subprocess on CPU runs mode 1 (the last split of a head polls; the interpreter runs the
programs one after another, so mode 2, where every split waits for the others, is refused there). The same script runs
compiled under the ``gpu`` marker with the Llama-3-8B heads (deq 3, PDL on Hopper, modes 1 and 2) and in a CUDA graph
replayed at other lengths. The sm_90 PTX (Triton's compiler, CPU): no atomic and no fence with ``SPIN``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.quant.fp8_inputs import needs_cuda

SCRIPT = r"""
import os
import torch
from octavo.nn.kv_quant import dequantize
from octavo.plugins.attention import _fp8_kv_decode_bs1 as one
from octavo.plugins.attention._fp8_decode_merge import SENTINEL
from tests.quant.fp8_attn_cases import paged_case, reference

PAGE = 16
E4M3 = torch.float8_e4m3fn
DEV = torch.device(os.environ.get("DECODE_TEST_DEVICE", "cpu"))
PDL = ({"PDL": True, "launch_pdl": True} if DEV.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0)
       else None)
gen = torch.Generator().manual_seed(0)


def launch(case, L, splits, bn, deq, spin, ks, vs, rope=None):
    q, kn, vn, kc, vc, bt, slot = case
    k2, v2 = kc.clone(), vc.clone()
    out = torch.full((1, q.shape[1], q.shape[2]), float("nan"), dtype=torch.bfloat16, device=DEV)
    one.fp8_decode_one(q, kn, vn, k2, v2, bt, torch.tensor([L], dtype=torch.int32, device=DEV), slot, out,
                       scale=q.shape[2] ** -0.5 * ks, k_scale=ks, v_scale=vs, splits=splits, block_n=bn, deq=deq,
                       pdl=PDL, spin=spin, rope=rope)
    return out, k2.view(torch.uint8), v2.view(torch.uint8)


def sentinels_back(kv, splits, d):
    for key, buf in one._SCRATCH.items():
        if key[0] == "spin" and key[2:4] == (kv, splits):
            bits = buf.view(torch.int32)
            # every word the writers may touch is the sentinel again (rows past the group never were written)
            assert int((bits != SENTINEL).sum()) == 0, ("sentinels not back", int((bits != SENTINEL).sum()))


def check(heads, kv, d, lens, splits, bn, deq, modes, ks=0.5, vs=0.25):
    for L in lens:  # one launch after another on the same scratch, each with new inputs
        q, kc, vc, _, _, bt, tables = paged_case(gen, heads, kv, d, [L], E4M3, torch.bfloat16, ks, vs, PAGE)
        kn = (torch.randn(1, kv, d, generator=gen) * 2).to(torch.bfloat16)
        vn = torch.randn(1, kv, d, generator=gen).to(torch.bfloat16)
        slot = torch.tensor([tables[0][(L - 1) // PAGE] * PAGE + (L - 1) % PAGE])
        case = tuple(t.to(DEV) for t in (q, kn, vn, kc, vc, bt[0], slot))
        base = launch(case, L, splits, bn, deq, 0, ks, vs)
        for mode in modes:
            assert one.spin_mode(DEV, kv, splits, d, mode) == mode, (mode, "not taken here")
            got = launch(case, L, splits, bn, deq, mode, ks, vs)
            assert all(torch.equal(a, b) for a, b in zip(base, got)), (L, splits, mode, "other bits")
            sentinels_back(kv, splits, d)
        # the reference reads the cache as this launch left it (its new-token bytes: test_fp8_decode_one.py)
        want = reference(q, dequantize(base[1].view(E4M3).cpu(), ks, torch.float64),
                         dequantize(base[2].view(E4M3).cpu(), vs, torch.float64), tables, [L], d ** -0.5)
        err = float((base[0].cpu().double() - want).abs().max() / want.abs().max())
        assert err <= 1e-2, (L, splits, err)
        print("ok", heads, kv, d, L, splits, modes, f"{err:.2e}")


if DEV.type == "cuda":  # Llama-3-8B heads, the engine's conversion and launch
    check(32, 8, 128, (700, 1, 2000, 641, 33), 16, 64, 3, (1, 2), ks=0.05, vs=0.02)
    check(32, 8, 128, (1500, 200), 8, 64, 3, (1, 2), ks=0.05, vs=0.02)
    # a CUDA graph captured once per mode, replayed at other lengths: the readers reset the sentinels inside the launch
    heads, kv, d, ks, vs = 32, 8, 128, 0.05, 0.02
    q, kc, vc, kf, vf, bt, tables = paged_case(gen, heads, kv, d, [2000], E4M3, torch.bfloat16, ks, vs, PAGE)
    q, kc, vc, bt = q.to(DEV), kc.to(DEV), vc.to(DEV), bt.to(DEV)
    kn = torch.randn(1, kv, d, device=DEV, dtype=torch.bfloat16)
    vn = torch.randn(1, kv, d, device=DEV, dtype=torch.bfloat16)
    lens = torch.tensor([2000], dtype=torch.int32, device=DEV)
    slot = torch.tensor([-1], device=DEV)
    outs = {m: torch.empty(1, heads, d, dtype=torch.bfloat16, device=DEV) for m in (0, 1, 2)}
    graphs = {}
    for m in (0, 1, 2):
        run = lambda m=m: one.fp8_decode_one(q, kn, vn, kc, vc, bt[0], lens, slot, outs[m], scale=d ** -0.5 * ks,
                                             k_scale=ks, v_scale=vs, splits=16, block_n=64, deq=3, pdl=PDL, spin=m)
        run()
        graphs[m] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[m]):
            run()
    for L in (1700, 3, 2000, 640, 641):
        lens.fill_(L)
        for m in (0, 1, 2, 2, 1):
            outs[m].fill_(float("nan"))
            graphs[m].replay()
        torch.cuda.synchronize()
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), ("graph", L)
        assert not torch.isnan(outs[0]).any(), ("graph", L)
        print("ok graph", L)
    sentinels_back(kv, 16, d)
else:
    check(8, 2, 32, (70, 1, 33, 64), 4, 16, 0, (1,))
    check(16, 4, 64, (45, 100), 8, 16, 0, (1,))
    try:
        one.spin_mode(torch.device("cpu"), 2, 4, 32, 2)
        raise AssertionError("spin=2 accepted under the interpreter")
    except ValueError as e:
        assert "spin=2" in str(e)
print("PASS")
"""


def _run(env_extra):
    env = {**os.environ, **env_extra}
    env.pop("OCTAVO_FP8_DECODE_ONE_SPIN", None)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900, cwd=root)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_fp8_decode_spin_interpreted():
    out = _run({"TRITON_INTERPRET": "1", "DECODE_TEST_DEVICE": "cpu"})
    assert out.count("ok ") == 6


@pytest.mark.gpu
@needs_cuda
def test_fp8_decode_spin_on_cuda():
    out = _run({"DECODE_TEST_DEVICE": "cuda"})
    assert out.count("ok ") == 7 + 5


@pytest.mark.parametrize("spin", [1, 2])
def test_sm90_spin_has_no_atomic_and_polls_in_a_loop(spin):
    """sm_90 PTX of the engine's launch (8B heads, rotary inside, PDL): with ``SPIN`` no ``atom`` and no ``fence`` /
    ``membar``; the partials' L1-bypassing loads sit in a loop (a backward branch after them)."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget

    from octavo.plugins.attention._fp8_kv_decode_bs1 import _fp8_decode_one_kernel

    names = ["q_ptr", "k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr", "table_ptr", "seq_len_ptr", "slot_ptr", "out_ptr",
             "part_ptr", "ml_ptr", "count_ptr", "stride_qh", "stride_kh", "stride_vh", "stride_oh", "stride_blk",
             "stride_pos", "scale_log2", "out_scale", "k_scale", "v_scale"]
    types = ["*bf16"] * 3 + ["*fp8e4nv"] * 2 + ["*i32", "*i32", "*i64", "*bf16", "*fp32", "*fp32", "*i32"] \
        + ["i32"] * 6 + ["fp32"] * 4
    consts = dict(GROUP=4, G_P=16, HEAD=128, PAGE=16, BLOCK_N=64, SPLITS=16, DEQ=3, EARLY=True, PDL=True,
                  EARLY_IO=True, ROPE=True, SPIN=spin)
    sig = {**dict(zip(names, types)), "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "stride_cos": "i32"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(18)}
    src = triton.compiler.ASTSource(fn=_fp8_decode_one_kernel, signature={**sig, **{k: "constexpr" for k in consts}},
                                    constexprs=consts, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 4, "num_stages": 1}).asm["ptx"]
    assert "atom." not in ptx and "fence." not in ptx and "membar" not in ptx
    polls = [m.start() for m in re.finditer(r"ld\.global\.cg", ptx)]
    assert len(polls) >= 16 * 3, len(polls)
    back = [m for m in re.finditer(r"bra(\.uni)?\s+\$L__BB0_(\d+)", ptx) if m.start() > polls[-1]]
    labels = {m.group(1): m.start() for m in re.finditer(r"\$L__BB0_(\d+):", ptx)}
    assert any(labels.get(b.group(2), 1 << 60) < polls[0] for b in back), "no loop around the polls"
