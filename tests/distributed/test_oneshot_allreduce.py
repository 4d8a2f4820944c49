"""The one-shot all-reduce kernel (plugins/platforms/cuda_allreduce.py) without a GPU: two processes, each a rank,
run it in Triton's interpreter over file-backed buffers both map (the CPU stand-in for symmetric memory: each
process builds its own pointer tables, as CUDA IPC gives each rank its own addresses). Checks the protocol's
indexing, epochs and double buffering over a sequence of sizes (one CTA, several CTAs, a ragged tail, one
element): every rank ends with the rank-order sum (within one bf16 rounding: the interpreter's fp32 -> bf16
cast truncates where the GPU rounds to nearest) and both ranks bitwise equal; then the all-gather kernel on the
same epochs (float, int64 and bf16 rows) gives exact copies. The memory ordering (release /
acquire over NVLink) is only checked on GPUs: tests/gpu/test_tp_allreduce_gpu.py, benchmarks/gpu_allreduce.py.
The second test runs the all-reduce + RMSNorm fusion (cuda_allreduce_fusion.py) the same way. Both also run the
low-latency variant (cuda_allreduce_ll.py, data words tagged with the call index) on the same epochs: bitwise
the flag protocol's results.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SIZES = [4096, 1, 777, 4096 * 3 + 5, 3]
WORLD = 2


def _rank_main(rank: int, tmp: str) -> None:
    import torch

    from octavo.plugins.platforms import cuda_allreduce as ca
    from octavo.plugins.platforms import cuda_allreduce_ll as ll

    max_bytes = 64 * 1024
    bufs = [torch.from_file(os.path.join(tmp, f"buf{r}"), shared=True, size=_buf_bytes(), dtype=torch.uint8)
            for r in range(WORLD)]
    flags = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    data = torch.tensor([b.data_ptr() + ca.FLAG_BYTES for b in bufs], dtype=torch.int64)
    lls = torch.tensor([b.data_ptr() + ca.FLAG_BYTES + 2 * WORLD * max_bytes for b in bufs], dtype=torch.int64)
    counters = torch.zeros(ca.MAX_CTAS, dtype=torch.int64)
    for i, n in enumerate(SIZES):
        xs = [torch.randn(n, generator=torch.Generator().manual_seed(100 * i + r)).to(torch.bfloat16)
              for r in range(WORLD)]
        x = xs[rank].clone()
        grid = (min(ca.MAX_CTAS, -(-n // ca.BLOCK)),)
        ca._one_shot_kernel[grid](x, n, flags, data, counters, max_bytes // 2, RANK=rank, WORLD=WORLD,
                                  MAXG=ca.MAX_CTAS, BLOCK=ca.BLOCK, PDL=bool(i % 2))  # cuda_pdl.py's path too
        torch.save(x, os.path.join(tmp, f"out{rank}_{i}.pt"))
    assert counters.tolist() == [len(SIZES)] * ca.MAX_CTAS  # one global call index in every CTA slot
    gathers = [((3, 100), torch.float32), ((5,), torch.int64), ((1, 2500), torch.bfloat16)]
    for shape, dtype in gathers:  # the all-gather kernel on the same epochs: exact copies
        x = torch.arange(_numel(shape), dtype=torch.float32).reshape(shape).mul(rank + 1).to(dtype)
        out = torch.empty((*shape[:-1], shape[-1] * WORLD), dtype=dtype)
        n = x.numel()
        ca._one_shot_gather_kernel[(min(ca.MAX_CTAS, -(-n // ca.BLOCK)),)](
            x, out, n, shape[-1], flags, data, counters, max_bytes // x.element_size(), RANK=rank, WORLD=WORLD,
            MAXG=ca.MAX_CTAS, BLOCK=ca.BLOCK)
        want = torch.cat([torch.arange(n, dtype=torch.float32).reshape(shape).mul(r + 1).to(dtype)
                          for r in range(WORLD)], dim=-1)
        assert torch.equal(out, want), f"all-gather {shape} {dtype}"
    for i, n in enumerate(SIZES):  # the LL kernel (cuda_allreduce_ll.py) on the same epochs: the flag sums, bitwise
        x = torch.randn(n, generator=torch.Generator().manual_seed(100 * i + rank)).to(torch.bfloat16)
        ll._one_shot_ll_kernel[(min(ca.MAX_CTAS, -(-n // ca.BLOCK)),)](
            x, n, lls, counters, RANK=rank, WORLD=WORLD, MAXG=ca.MAX_CTAS, BLOCK=ca.BLOCK, CAP=ll.LL_CAP_WORDS,
            PDL=bool(i % 2))
        assert torch.equal(x, torch.load(os.path.join(tmp, f"out{rank}_{i}.pt"))), f"LL sum differs at size {n}"
    assert counters.tolist() == [2 * len(SIZES) + len(gathers)] * ca.MAX_CTAS



def _buf_bytes() -> int:  # flags, data[2][W][64 KiB], LL words[2][W][...] (cuda_allreduce.py's layout)
    from octavo.plugins.platforms import cuda_allreduce as ca
    from octavo.plugins.platforms import cuda_allreduce_ll as ll

    return ca.FLAG_BYTES + 2 * WORLD * 64 * 1024 + 2 * WORLD * ll.LL_REGION_BYTES_PER_SLOT


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_one_shot_kernel_two_ranks_in_the_interpreter(tmp_path):
    import torch


    for r in range(WORLD):
        (tmp_path / f"buf{r}").write_bytes(b"\0" * _buf_bytes())
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(tmp_path)], env=env) for r in range(WORLD)]
    try:
        assert [p.wait(timeout=240) for p in procs] == [0] * WORLD
    finally:
        for p in procs:
            p.kill()
    for i, n in enumerate(SIZES):
        outs = [torch.load(tmp_path / f"out{r}_{i}.pt") for r in range(WORLD)]
        ref = sum(torch.randn(n, generator=torch.Generator().manual_seed(100 * i + r)).to(torch.bfloat16).float()
                  for r in range(WORLD))
        assert all(torch.equal(outs[0], o) for o in outs), f"ranks differ at size {n}"
        ulp = ref.to(torch.bfloat16).float().abs() * 2.0 ** -7
        assert ((outs[0].float() - ref).abs() <= ulp).all(), f"wrong sum at size {n}"


def _fusion_main(rank: int, tmp: str, port: str) -> None:
    """Deferral + the all-reduce/add/RMSNorm kernel behind ``tp_all_reduce`` and wrapped (Triton-fused) norms, in
    the shape of a Llama forward (an embedding-like sum consumed by a norm without residual: flushed; o_proj- and
    down_proj-like sums consumed by residual norms: fused), against the same forward without deferral."""
    import types

    import torch
    import torch.distributed as dist

    from octavo.nn import parallel
    from octavo.nn.layernorm import RMSNorm
    from octavo.plugins.platforms import cuda_allreduce_fusion as caf
    from octavo.plugins.platforms.cuda_fusions import _fused_rms_forward

    ar = file_backed_all_reduce(rank, tmp, port)
    d = 64
    norms = [RMSNorm(d, 1e-5).to(torch.bfloat16) for _ in range(3)]
    for i, m in enumerate(norms):
        m.weight.data = (torch.rand(d, generator=torch.Generator().manual_seed(i)) + 0.5).to(torch.bfloat16)
        m.forward = types.MethodType(_fused_rms_forward, m)  # as cuda_fusions.fuse_model installs it
        caf._wrap_norm(m, ar)
    gen = torch.Generator().manual_seed(7 + rank)
    ws = [torch.randn(d, d, generator=gen).to(torch.bfloat16) * 0.1 for _ in range(3)]
    x0 = torch.randn(3, d, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)

    def forward():
        h = parallel.tp_all_reduce(x0 @ ws[0])
        res = h
        h = norms[0](h)
        h, res = norms[1](parallel.tp_all_reduce(h @ ws[1]), res)
        return norms[2](parallel.tp_all_reduce(h @ ws[2]), res)

    want = forward()
    ar.defer_rows, ar.defer_width = 8, d
    assert torch.equal(forward()[0], want[0]) and ar.num_calls == 6  # deferral only inside a row-parallel layer
    ar.allow_defer = True  # as inside every row-parallel layer's forward
    got = forward()
    ar.allow_defer = False
    assert ar.pending is None and ar.num_calls == 9  # 3 + 3 plain, then 1 flushed + 2 fused
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    ar.ll = True  # the LL words (cuda_allreduce_ll.py) for the plain and the fused kernel: same results
    ar.allow_defer = True
    got = forward()
    ar.allow_defer = False
    assert ar.pending is None and ar.num_calls == 12
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    dist.destroy_process_group()


def file_backed_all_reduce(rank: int, tmp: str, port: str):
    """(a rank process) the gloo group and a ``OneShotAllReduce`` with the GPU constructor's fields over the shared
    files ``tmp/buf{r}`` (flag, data and LL regions), installed as the tensor-parallel all-reduce; also used by
    test_gemv_push.py."""
    import torch
    import torch.distributed as dist

    from octavo.nn import parallel
    from octavo.plugins.platforms import cuda_allreduce as ca

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    max_bytes = 64 * 1024
    bufs = [torch.from_file(os.path.join(tmp, f"buf{r}"), shared=True, size=_buf_bytes(), dtype=torch.uint8)
            for r in range(WORLD)]
    ar = ca.OneShotAllReduce.__new__(ca.OneShotAllReduce)
    ar.files = bufs  # the mappings must outlive the tables that hold their addresses
    ar.rank, ar.world, ar.max_bytes, ar.num_calls, ar.group = rank, WORLD, max_bytes, 0, dist.group.WORLD
    ar.flag_table = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    ar.data_table = torch.tensor([b.data_ptr() + ca.FLAG_BYTES for b in bufs], dtype=torch.int64)
    ar.ll_table = torch.tensor([b.data_ptr() + ca.FLAG_BYTES + 2 * WORLD * max_bytes for b in bufs], dtype=torch.int64)
    ar.ll, ar.push, ar.pending_pushed = False, False, False  # (push: cuda_allreduce_gemv.py, test_gemv_push.py)
    ar.counters = torch.zeros(ca.MAX_CTAS, dtype=torch.int64)
    ar.defer_rows, ar.defer_width, ar.pending, ar.allow_defer = 0, 0, None, False
    parallel.set_all_reduce(ar)
    return ar


def run_rank_processes(script: str, tmp_path, timeout: float = 240) -> None:
    """Zeroed shared buffer files in ``tmp_path``, then ``WORLD`` processes ``script rank tmp port`` under Triton's
    interpreter; every one must exit 0 (also used by test_gemv_push.py)."""
    import socket

    for r in range(WORLD):
        (tmp_path / f"buf{r}").write_bytes(b"\0" * _buf_bytes())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    procs = [subprocess.Popen([sys.executable, script, str(r), str(tmp_path), str(port)], env=env)
             for r in range(WORLD)]
    try:
        assert [p.wait(timeout=timeout) for p in procs] == [0] * WORLD
    finally:
        for p in procs:
            p.kill()


def test_all_reduce_norm_fusion_equals_unfused_in_the_interpreter(tmp_path):
    pytest.importorskip("octavo.plugins.platforms.cuda_fusions")
    run_rank_processes(__file__, tmp_path)


if __name__ == "__main__":
    if len(sys.argv) > 3:
        _fusion_main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
    else:
        _rank_main(int(sys.argv[1]), sys.argv[2])
