"""The one-shot all-reduce (``OCTAVO_TP_ALLREDUCE=custom``, plugins/platforms/cuda_allreduce.py) on two GPUs:
sums equal NCCL's bit for bit (random bf16 and fp32 tensors of several sizes, eager and inside CUDA graphs that
mix sizes, so the epoch bookkeeping of idle CTA slots is exercised), its all-gather equals NCCL's (logits, ids), the
all-reduce + residual add + RMSNorm kernel equals NCCL's sum followed by the unfused norm kernel bit for bit (eager
and in a graph, also with PDL launches and with the LL protocol), and a tensor-parallel engine with it gives
the same greedy tokens (fp32, a random HF Llama checkpoint) as with NCCL and as one GPU, with and without the
all-reduce + RMSNorm fusion. Needs 2 GPUs (skips otherwise; benchmarks/device/dist8.sh
runs it, part test6)."""

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

SIZES = [1, 777, 4096, 4096 * 3 + 5, 65536, 262144, 524288]  # elements; 524288 bf16 = 1 MiB, the cap


def _two_gpus() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


needs_two = pytest.mark.skipif("not _two_gpus()", reason="needs 2 CUDA GPUs")


def _exit_if_orphaned_or_late(limit_s: float = 120.0) -> None:
    """A hung kernel (a flag or LL word that never arrives) spins forever; if pytest is killed meanwhile, this
    spawned rank would keep its GPU. A watchdog thread exits the process (which frees the GPU) when the parent
    is gone or after ``limit_s``."""
    import threading
    import time

    parent, t0 = os.getppid(), time.monotonic()

    def watch():
        while True:
            time.sleep(0.5)
            if os.getppid() != parent or time.monotonic() - t0 > limit_s:
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def _worker(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from octavo.plugins.platforms.cuda_allreduce import OneShotAllReduce

    _exit_if_orphaned_or_late()
    from octavo.plugins.platforms.cuda_pdl import set_pdl

    set_pdl(False)  # plain launches first (PDL is on by default on sm_90+); the PDL pass comes below
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    dev = torch.device("cuda", rank)
    ar = OneShotAllReduce(None, dev, 1 << 20)
    gen = torch.Generator(device=dev).manual_seed(rank)
    bad = []

    def check(tag, y, ref):
        if not torch.equal(y, ref):
            bad.append(f"{tag}: max diff {(y.float() - ref.float()).abs().max().item()}")

    for dtype in (torch.bfloat16, torch.float32):
        fits = [n for n in SIZES if n * torch.empty((), dtype=dtype).element_size() <= 1 << 20]
        # eager, then one graph with every size twice (alternating small and large calls)
        _check_sums(ar, dev, gen, check, dtype, fits, fits * 2, f"{dtype} ")
    for shape, dtype in (((1, 64128), torch.float32), ((3, 1000), torch.bfloat16), ((7,), torch.int64)):
        x = (torch.randint(0, 128256, shape, device=dev) if dtype == torch.int64
             else torch.randn(shape, generator=gen, device=dev).to(dtype))
        parts = [torch.empty_like(x) for _ in range(2)]
        dist.all_gather(parts, x)
        got = ar.all_gather(x)
        if got is None or not torch.equal(got, torch.cat(parts, dim=-1)):
            bad.append(f"all_gather {shape} {dtype}")
    _check_fused_norm(ar, dev, gen, check)
    set_pdl(True)  # the same with programmatic dependent launches (OCTAVO_PDL=1): plain, fused and in graphs
    try:
        _check_fused_norm(ar, dev, gen, lambda tag, y, ref: check("pdl " + tag, y, ref), [torch.bfloat16])
    finally:
        set_pdl(False)
    ar.ll = True  # the LL words (cuda_allreduce_ll.py): 16-bit messages up to 64 KiB, mixed with flag calls
    try:
        _check_sums(ar, dev, gen, check, torch.bfloat16, (1, 777, 4096, 4096 * 3 + 5, 32768, 32769),
                    (4096, 200000, 4096, 777, 32768), "ll ")  # over 32768 bf16 (64 KiB): the flag kernel
        _check_fused_norm(ar, dev, gen, lambda tag, y, ref: check("ll " + tag, y, ref), [torch.bfloat16])
    finally:
        ar.ll = False
    big = torch.ones((1 << 20) // 2 + 1, dtype=torch.bfloat16, device=dev)
    declined = ar(big) is None  # over the cap: the caller's NCCL path
    torch.cuda.synchronize()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"bad": bad, "declined_over_cap": declined}, f)
    dist.barrier()
    dist.destroy_process_group()


def _check_sums(ar, dev, gen, check, dtype, eager_sizes, graph_sizes, tag) -> None:
    """``ar`` equals NCCL's all-reduce bit for bit: eager on each size, then in one CUDA graph of ``graph_sizes``
    replayed three times with new inputs (the epochs of calls of different sizes stay in step)."""
    import torch
    import torch.distributed as dist

    for n in eager_sizes:
        x = torch.randn(n, generator=gen, device=dev).to(dtype)
        ref = x.clone()
        dist.all_reduce(ref)
        assert ar(x) is x
        check(f"{tag}eager {n}", x, ref)
    xs = [torch.zeros(n, dtype=dtype, device=dev) for n in graph_sizes]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for x in xs:
            ar(x)
    for trial in range(3):
        for x in xs:
            x.copy_(torch.randn(x.numel(), generator=gen, device=dev))
        refs = [x.clone() for x in xs]
        for r in refs:
            dist.all_reduce(r)
        g.replay()
        for x, r in zip(xs, refs):
            check(f"{tag}graph {x.numel()} trial {trial}", x, r)


def _check_fused_norm(ar, dev, gen, check, dtypes=None) -> None:
    """The all-reduce + residual add + RMSNorm kernel (cuda_allreduce_fusion.py) bit for bit against NCCL's sum
    followed by cuda_fusions' norm kernel (the unfused path it replaces): bf16 and fp16 rows of the 8B width and an
    odd width, eager and replayed in a graph that mixes it with plain all-reduces (shared epochs)."""
    import torch
    import torch.distributed as dist

    from octavo.plugins.platforms.cuda_allreduce_fusion import all_reduce_add_rms_norm
    from octavo.plugins.platforms.cuda_fusions import rms_norm

    def unfused(x, res, w):
        s = x.clone()
        dist.all_reduce(s)
        return rms_norm(s, w, 1e-5, res)

    for dtype in dtypes or (torch.bfloat16, torch.float16):
        for rows, d in ((1, 4096), (3, 4096), (8, 4096), (2, 5000), (1, 8192)):
            x = torch.randn(rows, d, generator=gen, device=dev).to(dtype)
            res = torch.randn(rows, d, generator=torch.Generator(device=dev).manual_seed(rows), device=dev).to(dtype)
            w = (torch.rand(d, generator=torch.Generator(device=dev).manual_seed(d), device=dev) + 0.5).to(dtype)
            want = unfused(x, res, w)
            got = all_reduce_add_rms_norm(ar, x.clone(), res, w, 1e-5)
            check(f"fused norm eager {dtype} {rows}x{d} out", got[0], want[0])
            check(f"fused norm eager {dtype} {rows}x{d} residual", got[1], want[1])
        rows, d = 1, 4096  # the decode step's pattern: plain all-reduce, fused, plain, fused
        xs = [torch.zeros(rows, d, dtype=dtype, device=dev) for _ in range(4)]
        res = torch.randn(rows, d, generator=gen, device=dev).to(dtype)
        w = (torch.rand(d, generator=gen, device=dev) + 0.5).to(dtype)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            ar(xs[0])
            o1 = all_reduce_add_rms_norm(ar, xs[1], res, w, 1e-5)
            ar(xs[2])
            o2 = all_reduce_add_rms_norm(ar, xs[3], o1[1], w, 1e-5)
        for trial in range(3):
            for x in xs:
                x.copy_(torch.randn(x.shape, generator=gen, device=dev))
            ins = [x.clone() for x in xs]
            g.replay()
            r0 = ins[0].clone()
            dist.all_reduce(r0)
            w1 = unfused(ins[1], res, w)
            w2 = unfused(ins[3], w1[1], w)
            check(f"fused norm graph {dtype} trial {trial} plain", xs[0], r0)
            check(f"fused norm graph {dtype} trial {trial} first", o1[0], w1[0])
            check(f"fused norm graph {dtype} trial {trial} second", o2[0], w2[0])
            check(f"fused norm graph {dtype} trial {trial} second residual", o2[1], w2[1])


@needs_two
def test_one_shot_all_reduce_equals_nccl(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "res.json")
    mp.spawn(_worker, args=(port, out), nprocs=2, join=True)
    res = json.load(open(out))
    assert res["bad"] == []
    assert res["declined_over_cap"]


_ENGINE = """
import json, sys
from octavo import LLM, SamplingParams
llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, max_model_len=256, max_num_seqs=8,
          seed=0, dtype="float32", tensor_parallel_size=int(sys.argv[2]))
prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 1000 + 1 for j in range(5 + 9 * i)]} for i in range(4)]
outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), use_tqdm=False)
print("TOKENS", json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
llm.llm_engine.shutdown()
"""


def _tokens(model_dir: str, tp: int, allreduce: str, fuse_norm: bool = False, pdl: bool = False) -> list:
    env = {**os.environ, "OCTAVO_TP_ALLREDUCE": allreduce, "OCTAVO_TP_ALLREDUCE_FUSE_NORM": "1" if fuse_norm else "0",
           "OCTAVO_PDL": "1" if pdl else "0"}
    p = subprocess.run([sys.executable, "-c", _ENGINE, model_dir, str(tp)], env=env, capture_output=True,
                       text=True, timeout=240)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("TOKENS ")]
    assert p.returncode == 0 and lines, p.stderr[-3000:]
    return json.loads(lines[-1][len("TOKENS "):])


@needs_two
def test_tp2_custom_all_reduce_tokens_equal_nccl_and_one_gpu(tmp_path):
    # a random HF Llama (4 layers, 8 heads) saved as a checkpoint: the same weights at any TP
    from tests.gpu.parity import build_checkpoint

    path = build_checkpoint(str(tmp_path), "LlamaForCausalLM")
    custom = _tokens(path, 2, "custom")  # CUDA graphs on: the custom kernel runs captured
    assert custom == _tokens(path, 2, "nccl")
    assert custom == _tokens(path, 1, "nccl")
    assert custom == _tokens(path, 2, "custom", fuse_norm=True)  # all-reduce + RMSNorm in one kernel
    assert custom == _tokens(path, 2, "custom", fuse_norm=True, pdl=True)  # + programmatic dependent launches
