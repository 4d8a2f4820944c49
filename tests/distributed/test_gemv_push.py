"""The row-parallel GEMV that pushes its output (plugins/platforms/cuda_allreduce_gemv.py) without a GPU: two
processes, each a rank, in Triton's interpreter over file-backed buffers both map (as in
test_oneshot_allreduce.py). A Llama-like chain of real ``RowParallelLinear`` layers on cuda_fusions' GEMV method,
wrapped RMSNorms and the all-reduce + RMSNorm fusion, run with the push off and then on for several calls (epochs
and both parities): the pushed path must give bitwise the same hidden states and residuals, the pushed message
consumed by the fused norm AND by a plain consumer (a norm without residual: the receive-only LL kernel), with
every GEMV of the chain really pushing. Also the eligibility rule and that the push kernel never runs untuned
(the plain GEMV's config is required). The memory ordering over NVLink is checked on GPUs
(tests/gpu/test_tp_allreduce_gpu.py, ``gemv_push``).
"""

import os
import sys

import pytest

pytest.importorskip("triton")

WORLD = 2


def _rank_main(rank: int, tmp: str, port: str) -> None:
    import types

    import torch
    import torch.distributed as dist

    from octavo.nn.layernorm import RMSNorm
    from octavo.nn.linear import RowParallelLinear
    from octavo.plugins.platforms import cuda_allreduce as ca
    from octavo.plugins.platforms import cuda_allreduce_fusion as caf
    from octavo.plugins.platforms import cuda_allreduce_gemv as cag
    from octavo.plugins.platforms import cuda_fusions
    from octavo.plugins.platforms.cuda_gemv_table import set_override
    from tests.distributed.test_oneshot_allreduce import file_backed_all_reduce

    ar = file_backed_all_reduce(rank, tmp, port)
    d, inner = 64, 96  # hidden 64; row-parallel input 96 in all, 48 per rank (ragged for the 16-wide tile)
    ar.defer_width = d
    gen = torch.Generator().manual_seed(11 + rank)  # each rank its own shard of every weight
    method = cuda_fusions._gemv_linear_method()
    layers = []
    for _ in range(3):
        m = RowParallelLinear(inner, d, bias=False, quant_method=method).to(torch.bfloat16)
        assert m.weight.shape == (d, inner // WORLD)
        m.weight.data = (torch.randn(d, inner // WORLD, generator=gen) * 0.2).to(torch.bfloat16)
        assert cag.push_eligible(m, d) and not cag.push_eligible(m, d + 1)
        caf._wrap_row_parallel(m, ar)
        layers.append(m)
    biased = RowParallelLinear(inner, d, bias=True, quant_method=method)
    assert not cag.push_eligible(biased, d)  # a bias is added after the sum: never pushed
    norms = [RMSNorm(d, 1e-5).to(torch.bfloat16) for _ in range(4)]
    for i, m in enumerate(norms):
        m.weight.data = (torch.rand(d, generator=torch.Generator().manual_seed(i)) + 0.5).to(torch.bfloat16)
        m.forward = types.MethodType(cuda_fusions._fused_rms_forward, m)  # as cuda_fusions.fuse_model installs it
        caf._wrap_norm(m, ar)
    up = [torch.randn(inner // WORLD, d, generator=torch.Generator().manual_seed(50 + i)).to(torch.bfloat16) * 0.3
          for i in range(3)]  # a column-parallel stand-in (same on both ranks: only the sums matter)
    x0 = torch.randn(1, d, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    pushed = []
    plain_push = caf.gemv_push

    def counting_push(a, x, w):
        y = plain_push(a, x, w)
        pushed.append(y is not None)
        return y

    caf.gemv_push = counting_push

    def forward():
        res = x0
        h = norms[0](x0)
        h, res = norms[1](layers[0](h @ up[0].t()), res)  # pushed, consumed by the fused norm
        h = norms[2](layers[1](h @ up[1].t()))  # no residual: the pushed message is flushed (receive only)
        h, res = norms[3](layers[2](h @ up[2].t()), res)
        return h, res

    want = forward()  # no deferral, no push: plain GEMVs + plain all-reduces
    assert ar.num_calls == 3 and not pushed
    ar.defer_rows = 8
    ar.push = True
    for _ in range(3):  # several calls: both parities, the epochs shared with the plain kernels
        got = forward()
        assert ar.pending is None and not ar.pending_pushed
        assert all(torch.equal(a, b) for a, b in zip(want, got)), "pushed GEMV path differs"
    assert pushed == [True] * 9, pushed
    assert ar.counters.tolist() == [12] * ca.MAX_CTAS  # 3 plain + 9 pushed calls, one index each
    ar.push = False  # back to the plain deferral on the same epochs: still the same results
    got = forward()
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    # a fixed tile of cuda_gemv_table.py (not the interpreter's 16 x 64): the plain and the pushing GEMV both take it
    set_override({(d, inner // WORLD): (8, 32, 4, 2)})
    want_tiles = forward()
    ar.push = True
    pushed.clear()
    got = forward()
    assert pushed == [True] * 3 and all(torch.equal(a, b) for a, b in zip(want_tiles, got)), "tiled push differs"
    set_override(None)
    # OCTAVO_TP_EARLY_POLL: the fused consumer polls the peer's words before its PDL wait (the interpreter's wait
    # is a no-op; the path and its sums run): still bitwise the plain path, and the EARLY kernel really ran
    early, real_kernel, real_opts = [], caf._one_shot_add_rms_kernel, caf.launch_opts

    class Spy:
        def __getitem__(self, grid):
            def run(*a, **kw):
                early.append((kw["EARLY"], kw["PRE"]))
                return real_kernel[grid](*a, **kw)
            return run

    caf._one_shot_add_rms_kernel, caf.launch_opts = Spy(), lambda: {"PDL": True}
    ar.early_poll = True
    for _ in range(2):  # both parities
        got = forward()
        assert all(torch.equal(a, b) for a, b in zip(want, got)), "early-polled consumer differs"
    assert early == [(True, False)] * 4, early  # two fused consumers a forward (the receive-only one is not fused)
    # OCTAVO_TP_CROSSING_PRELOAD: residual row, norm weight and call index loaded before the wait (pushed alone, with
    # EARLY, pushed again (the other parity), then the unpushed deferral: the flag protocol's fused consumer)
    ar.early_poll, ar.crossing_preload = False, True
    early.clear()
    for poll, push in ((False, True), (True, True), (False, True), (False, False)):
        ar.early_poll, ar.push = poll, push
        got = forward()
        assert all(torch.equal(a, b) for a, b in zip(want, got)), f"preloading consumer differs ({poll}, {push})"
    assert early == [(False, True)] * 2 + [(True, True)] * 2 + [(False, True)] * 4, early
    caf._one_shot_add_rms_kernel, caf.launch_opts, ar.early_poll, ar.crossing_preload = real_kernel, real_opts, False, False
    dist.destroy_process_group()


def test_gemv_push_equals_plain_in_the_interpreter(tmp_path):
    pytest.importorskip("octavo.plugins.platforms.cuda_fusions")
    from tests.distributed.test_oneshot_allreduce import run_rank_processes

    run_rank_processes(__file__, tmp_path)


def test_push_needs_the_plain_gemv_config(monkeypatch):
    """Outside the interpreter the push kernel only runs with the plain GEMV's tuned config (never autotuned
    itself: a tuning run would send words with a live call index)."""
    torch = pytest.importorskip("torch")
    from octavo.plugins.platforms import cuda_allreduce_gemv as cag
    from octavo.plugins.platforms import cuda_fusions

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(cuda_fusions._gemv_autotuned, "cache", {}, raising=False)
    assert cag.plain_gemv_config(4096, 2048, torch.bfloat16) is None

    class Cfg:
        kwargs, num_warps, num_stages = {"BLOCK_N": 8, "BLOCK_K": 512}, 4, 3

    cuda_fusions._gemv_autotuned.cache[(4096, 2048, False, True, "torch.bfloat16", "torch.bfloat16",
                                        "torch.bfloat16")] = Cfg
    assert cag.plain_gemv_config(4096, 2048, torch.bfloat16) == {"EVEN": True, "BLOCK_N": 8, "BLOCK_K": 512,
                                                                 "num_warps": 4, "num_stages": 3}
    assert cag.plain_gemv_config(4096, 2048, torch.float16) is None
    assert cag.plain_gemv_config(4096, 7168, torch.bfloat16) is None
    from octavo.plugins.platforms.cuda_gemv_table import set_override

    set_override({(4096, 7168): (4, 1024, 4, 3)})  # a fixed tile (cuda_gemv_table.py) counts as the plain config
    try:
        assert cag.plain_gemv_config(4096, 7168, torch.bfloat16) == {"EVEN": True, "BLOCK_N": 4, "BLOCK_K": 1024,
                                                                     "num_warps": 4, "num_stages": 3}
    finally:
        set_override(None)


@pytest.mark.parametrize("value,world,want", [(None, 2, True), (None, 4, False), ("1", 4, True), ("0", 2, False),
                                              ("", 2, True)])
def test_push_switch(monkeypatch, value, world, want):
    """OCTAVO_TP_GEMV_PUSH: unset = on at two ranks (the measured case) and off above; 1 = on; 0 = off; anything
    else is refused naming it."""
    from octavo.plugins.platforms import cuda_allreduce_gemv as cag

    if value is None:
        monkeypatch.delenv("OCTAVO_TP_GEMV_PUSH", raising=False)
    else:
        monkeypatch.setenv("OCTAVO_TP_GEMV_PUSH", value)
    assert cag.push_for_world(world) is want
    monkeypatch.setenv("OCTAVO_TP_GEMV_PUSH", "yes")
    with pytest.raises(ValueError, match="OCTAVO_TP_GEMV_PUSH"):
        cag.push_for_world(2)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    _rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3])


@pytest.mark.parametrize("name,value,want", [
    ("OCTAVO_TP_EARLY_POLL", None, (False, False)), ("OCTAVO_TP_EARLY_POLL", "0", (False, True)),
    ("OCTAVO_TP_EARLY_POLL", "1", (True, True)), ("OCTAVO_TP_CROSSING_PRELOAD", None, (True, False)),
    ("OCTAVO_TP_CROSSING_PRELOAD", "0", (False, True)), ("OCTAVO_TP_CROSSING_PRELOAD", "1", (True, True))])
def test_early_poll_and_preload_switches(monkeypatch, name, value, want):
    """OCTAVO_TP_EARLY_POLL (unset: off, measured slower) and OCTAVO_TP_CROSSING_PRELOAD (unset: on, measured faster):
    0 off, 1 on (explicit: an error where the fusion is off); anything else is refused naming it."""
    from octavo.plugins.platforms import cuda_allreduce_gemv as cag

    setting = {"OCTAVO_TP_EARLY_POLL": cag.early_poll_setting,
               "OCTAVO_TP_CROSSING_PRELOAD": cag.crossing_preload_setting}[name]
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    assert setting() == want
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(ValueError, match=name):
        setting()


@pytest.mark.parametrize("value,world,want", [(None, 2, True), (None, 4, False), ("1", 4, True), ("0", 2, False)])
def test_crossing_preload_for_world(monkeypatch, value, world, want):
    """The preload's default covers two ranks (the measured case), as the push's; more ranks with an explicit 1."""
    from octavo.plugins.platforms import cuda_allreduce_gemv as cag

    if value is None:
        monkeypatch.delenv("OCTAVO_TP_CROSSING_PRELOAD", raising=False)
    else:
        monkeypatch.setenv("OCTAVO_TP_CROSSING_PRELOAD", value)
    assert cag.crossing_preload_for_world(world) is want


@pytest.mark.parametrize("value,world,want", [(None, 2, 16), (None, 4, 0), ("", 2, 16), ("0", 2, 0), ("4", 2, 0),
                                              ("8", 2, 0)])
def test_two_rank_small_rows_norm_warps(monkeypatch, value, world, want):
    """With the fusion at two ranks the <= 4-row norms take 16 warps unless OCTAVO_NORM_SMALL_ROWS_WARPS says
    otherwise (any value, 0 included, is the user's: 0 returned = leave cuda_fusions' setting alone)."""
    from octavo.plugins.platforms import cuda_allreduce_fusion as caf

    if value is None:
        monkeypatch.delenv("OCTAVO_NORM_SMALL_ROWS_WARPS", raising=False)
    else:
        monkeypatch.setenv("OCTAVO_NORM_SMALL_ROWS_WARPS", value)
    assert caf.tp_small_rows_norm_warps(world) == want


@pytest.mark.parametrize("name", ["OCTAVO_TP_GEMV_PUSH", "OCTAVO_TP_EARLY_POLL", "OCTAVO_TP_CROSSING_PRELOAD"])
def test_explicit_push_or_early_poll_without_the_fusion_is_refused(monkeypatch, name):
    """Asked for explicitly where the all-reduce + RMSNorm fusion is off: an error naming it, never ignored."""
    from octavo.plugins.platforms import cuda_allreduce_fusion as caf

    monkeypatch.setenv("OCTAVO_TP_ALLREDUCE_FUSE_NORM", "0")
    monkeypatch.setenv(name, "1")
    with pytest.raises(ValueError, match=f"{name}=1 needs the all-reduce"):
        caf.maybe_fuse_all_reduce_norm(None, None)
