"""The one-shot all-reduce kernel (plugins/platforms/cuda_allreduce.py) without a GPU: two processes, each a rank,
run it in Triton's interpreter over file-backed buffers both map (the CPU stand-in for symmetric memory: each
process builds its own pointer tables, as CUDA IPC gives each rank its own addresses). Checks the protocol's
indexing, epochs and double buffering over a sequence of sizes (one CTA, several CTAs, a ragged tail, one
element): every rank ends with the rank-order sum (within one bf16 rounding: the interpreter's fp32 -> bf16
cast truncates where the GPU rounds to nearest) and both ranks bitwise equal. The memory ordering (release /
acquire over NVLink) is only checked on GPUs: tests/gpu/test_tp_allreduce_gpu.py, benchmarks/gpu_allreduce.py.
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

    max_bytes = 64 * 1024
    nbytes = ca.FLAG_BYTES + 2 * WORLD * max_bytes
    bufs = [torch.from_file(os.path.join(tmp, f"buf{r}"), shared=True, size=nbytes, dtype=torch.uint8)
            for r in range(WORLD)]
    flags = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    data = torch.tensor([b.data_ptr() + ca.FLAG_BYTES for b in bufs], dtype=torch.int64)
    counters = torch.zeros(ca.MAX_CTAS, dtype=torch.int64)
    for i, n in enumerate(SIZES):
        xs = [torch.randn(n, generator=torch.Generator().manual_seed(100 * i + r)).to(torch.bfloat16)
              for r in range(WORLD)]
        x = xs[rank].clone()
        grid = (min(ca.MAX_CTAS, -(-n // ca.BLOCK)),)
        ca._one_shot_kernel[grid](x, n, flags, data, counters, max_bytes // 2, RANK=rank, WORLD=WORLD,
                                  MAXG=ca.MAX_CTAS, BLOCK=ca.BLOCK)
        torch.save(x, os.path.join(tmp, f"out{rank}_{i}.pt"))
    assert counters.tolist() == [len(SIZES)] * ca.MAX_CTAS  # one global call index in every CTA slot


def test_one_shot_kernel_two_ranks_in_the_interpreter(tmp_path):
    import torch

    from octavo.plugins.platforms import cuda_allreduce as ca

    for r in range(WORLD):
        (tmp_path / f"buf{r}").write_bytes(b"\0" * (ca.FLAG_BYTES + 2 * WORLD * 64 * 1024))
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


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), sys.argv[2])
