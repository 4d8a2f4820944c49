"""The row-parallel GEMV that sends its output to the peer (``OCTAVO_TP_GEMV_PUSH=1``,
plugins/platforms/cuda_allreduce_gemv.py) on two GPUs: at the Llama-3-8B TP=2 shapes (o_proj [4096, 2048],
down_proj [4096, 7168], bf16) its local output equals cuda_fusions' GEMV bit for bit, and its pushed words
consumed by the all-reduce + add + RMSNorm kernel (or by the receive-only LL kernel) equal NCCL's sum followed
by the unfused norm bit for bit: eager, and in a CUDA graph with a decode layer's pattern (plain all-reduce,
push + fused norm, push + plain consumer, push + fused norm) replayed with new inputs, with and without PDL (and with the early poll, the preloaded
residual + weight, 16-warp norms).
The NVLink memory ordering of words written inside a GEMV is what only this test checks. Needs 2 GPUs
(benchmarks/device/dist8.sh, part test)."""

import json
import socket

import pytest

from tests.gpu.test_tp_allreduce_gpu import (  # _two_gpus: the skipif condition string evaluates here
    _exit_if_orphaned_or_late,
    _two_gpus,  # noqa: F401
    needs_two,
)

pytestmark = pytest.mark.gpu

SHAPES = [(4096, 2048), (4096, 7168)]  # o_proj and down_proj of the 8B shape at TP=2


def _worker(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from octavo.plugins.platforms.cuda_allreduce import OneShotAllReduce
    from octavo.plugins.platforms.cuda_allreduce_fusion import all_reduce_add_rms_norm
    from octavo.plugins.platforms.cuda_allreduce_gemv import gemv_push
    from octavo.plugins.platforms.cuda_allreduce_ll import ll_reduce
    from octavo.plugins.platforms.cuda_fusions import gemv, rms_norm, set_small_rows_norm_warps
    from octavo.plugins.platforms.cuda_gemv_table import set_override
    from octavo.plugins.platforms.cuda_pdl import set_pdl

    _exit_if_orphaned_or_late()
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    dev = torch.device("cuda", rank)
    ar = OneShotAllReduce(None, dev, 1 << 20)
    gen = torch.Generator(device=dev).manual_seed(rank)
    bad, pushed = [], []

    def check(tag, y, ref):
        if not torch.equal(y, ref):
            bad.append(f"{tag}: max diff {(y.float() - ref.float()).abs().max().item()}")

    ws = {s: (torch.randn(s, generator=gen, device=dev) * 0.02).to(torch.bfloat16) for s in SHAPES}
    nw = (torch.rand(4096, generator=gen, device=dev) + 0.5).to(torch.bfloat16)
    for (_n, k), w in ws.items():  # tune the plain GEMV first: the push kernel takes its config
        gemv(torch.randn(1, k, device=dev).to(torch.bfloat16), w)

    def push(x, w):
        y = gemv_push(ar, x, w)
        pushed.append(y is not None)
        return y if y is not None else gemv(x, w)  # (an untuned shape: recorded as not pushed, fails below)

    def want_fused(x, w, res):
        s = gemv(x, w)
        dist.all_reduce(s)
        return rms_norm(s, nw, 1e-5, res)

    def want_sum(x, w):
        s = gemv(x, w)
        dist.all_reduce(s)
        return s

    # fixed tiles (cuda_gemv_table.py) unlike the autotuner's: the plain and the pushing GEMV both take them
    tiles = {(4096, 2048): (4, 2048, 4, 2), (4096, 7168): (4, 1024, 4, 3)}
    # then the fused consumer polls the peer's words before its PDL wait (OCTAVO_TP_EARLY_POLL); last it loads the
    # residual + norm weight before the wait (OCTAVO_TP_CROSSING_PRELOAD), also with every <= 4-row norm (the plain
    # reference's too) on 16 warps (OCTAVO_NORM_SMALL_ROWS_WARPS)
    for fixed, pdl, early, pre, nw16 in ((None, False, False, False, False), (None, True, False, False, False),
                                         (tiles, True, False, False, False), (None, True, True, False, False),
                                         (None, True, False, True, False), (None, True, False, True, True)):
        set_pdl(pdl)
        set_override(fixed)
        ar.early_poll, ar.crossing_preload = early, pre
        set_small_rows_norm_warps(16 if nw16 else 0)
        tag = ("tiles " if fixed else "") + ("pdl " if pdl else "") + ("early " if early else "") + \
            ("preload " if pre else "") + ("16 warps " if nw16 else "")
        for (n, k), w in ws.items():  # eager: local output, fused consumer, receive-only consumer
            x = torch.randn(1, k, generator=gen, device=dev).to(torch.bfloat16)
            res = torch.randn(1, n, generator=gen, device=dev).to(torch.bfloat16)
            y = push(x, w)
            check(f"{tag}eager {k} local", y, gemv(x, w))
            got = all_reduce_add_rms_norm(ar, y, res, nw, 1e-5, pushed=True)
            ref = want_fused(x, w, res)
            check(f"{tag}eager {k} fused out", got[0], ref[0])
            check(f"{tag}eager {k} fused residual", got[1], ref[1])
            y = push(x, w)
            check(f"{tag}eager {k} receive-only", ll_reduce(ar, y, pushed=True), want_sum(x, w))
        wo, wd = ws[SHAPES[0]], ws[SHAPES[1]]
        xs = [torch.zeros(1, s[1], dtype=torch.bfloat16, device=dev) for s in (SHAPES[0], SHAPES[0], SHAPES[0],
                                                                                SHAPES[1])]
        plain_in = torch.zeros(1, 4096, dtype=torch.bfloat16, device=dev)
        res = torch.zeros(1, 4096, dtype=torch.bfloat16, device=dev)
        warm = torch.randn(1, 4096, generator=gen, device=dev).to(torch.bfloat16)
        ref = warm.clone()
        dist.all_reduce(ref)
        check(f"{tag}eager plain", ar(warm), ref)  # (also compiles the flag kernel before the capture)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # a decode layer's pattern, plus a plain all-reduce and a receive-only consumer
            ar(plain_in)
            o1 = all_reduce_add_rms_norm(ar, push(xs[0], wo), res, nw, 1e-5, pushed=True)
            s2 = ll_reduce(ar, push(xs[1], wo), pushed=True)
            o3 = all_reduce_add_rms_norm(ar, push(xs[3], wd), o1[1], nw, 1e-5, pushed=True)
        for trial in range(3):
            for x in (*xs, plain_in, res):
                x.copy_(torch.randn(x.shape, generator=gen, device=dev))
            ins = [x.clone() for x in (*xs, plain_in, res)]
            g.replay()
            r0 = ins[4].clone()
            dist.all_reduce(r0)
            w1 = want_fused(ins[0], wo, ins[5])
            w3 = want_fused(ins[3], wd, w1[1])
            check(f"{tag}graph trial {trial} plain", plain_in, r0)
            check(f"{tag}graph trial {trial} first", o1[0], w1[0])
            check(f"{tag}graph trial {trial} receive-only", s2, want_sum(ins[1], wo))
            check(f"{tag}graph trial {trial} third", o3[0], w3[0])
            check(f"{tag}graph trial {trial} third residual", o3[1], w3[1])
    set_pdl(False)
    set_override(None)
    set_small_rows_norm_warps(0)
    torch.cuda.synchronize()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"bad": bad, "pushed": pushed}, f)
    dist.barrier()
    dist.destroy_process_group()


@needs_two
def test_gemv_push_equals_nccl(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "res.json")
    mp.spawn(_worker, args=(port, out), nprocs=2, join=True)
    res = json.load(open(out))
    assert res["pushed"] and all(res["pushed"]), "the push kernel did not run (no tuned GEMV config found)"
    assert res["bad"] == []
