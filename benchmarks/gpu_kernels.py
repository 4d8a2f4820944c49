"""GPU kernel benchmark: the card's two ceilings, the ``triton`` paged-attention kernels against them and
against torch SDPA (and flashinfer when importable), and a synthetic Llama-3-8B-shape batch-1 decode step
in a CUDA graph (what the engine's decode can reach with cuBLAS GEMV + these kernels).

    python benchmarks/gpu_kernels.py --out benchmarks/results/gpu_kernels_h100.json

Times are medians of CUDA-graph replays (``triton.testing.do_bench_cudagraph``) after warm-up.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tests.gpu.paged_reference import make_case, reference, rel_err  # noqa: E402


def bench(fn, rep=200):
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")  # ms


def copy_bandwidth() -> float:
    from gpu_e2e import copy_bandwidth as measure  # one definition for every GPU benchmark

    return measure()


def matmul_tflops() -> float:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = bench(lambda: a @ b, rep=300)
    return 2 * 8192**3 / (ms * 1e-3) / 1e12


def attention_case(seqs, hq=32, hkv=8, d=128, block_size=16, dtype=torch.bfloat16):
    from octavo.plugins.attention.triton import TritonAttentionBackend

    case = make_case(seqs, hq, hkv, d, block_size, dtype, "cuda", seed=len(seqs))
    be = TritonAttentionBackend(num_heads=hq, head_size=d, num_kv_heads=hkv, scale=d**-0.5)
    md = TritonAttentionBackend.build_metadata(case.layout, torch.device("cuda"))
    out = be.forward(case.query, case.key, case.value, case.kv_cache, md)
    err = rel_err(out, reference(case, d**-0.5)) if sum(c + q for c, q in seqs) <= 40000 else float("nan")
    ms = bench(lambda: be.forward(case.query, case.key, case.value, case.kv_cache, md))
    kv_bytes = sum(c + q for c, q in seqs) * hkv * d * 2 * case.kv_cache.element_size()
    flops = sum(4 * q * (c + (q + 1) / 2) * hq * d for c, q in seqs)
    # the same attention through torch SDPA on dense (unpaged) K/V, one request at a time for prefill
    qs, ks, vs = [], [], []
    start = 0
    for (_c, q), kf, vf in zip(seqs, case.k_full, case.v_full):
        qs.append(case.query[start:start + q].transpose(0, 1).unsqueeze(0))
        ks.append(kf.cuda().transpose(0, 1).unsqueeze(0))
        vs.append(vf.cuda().transpose(0, 1).unsqueeze(0))
        start += q
    decode = all(q == 1 for _, q in seqs) and len({c for c, _ in seqs}) == 1
    F = torch.nn.functional
    if decode:  # batched dense decode
        qb, kb, vb = torch.cat(qs), torch.cat(ks), torch.cat(vs)
        sdpa = lambda: F.scaled_dot_product_attention(qb, kb, vb, enable_gqa=True)  # noqa: E731
    elif len(seqs) == 1 and seqs[0][0] == 0:
        sdpa = lambda: F.scaled_dot_product_attention(qs[0], ks[0], vs[0], is_causal=True, enable_gqa=True)  # noqa
    else:
        sdpa = None
    sdpa_ms = bench(sdpa) if sdpa else None
    # eager timings (no graph): triton and, when importable, flashinfer on the same paged case
    import triton.testing

    eager = {"triton_eager_us": triton.testing.do_bench(
        lambda: be.forward(case.query, case.key, case.value, case.kv_cache, md), return_mode="median") * 1e3}
    from octavo.plugins.attention.flashinfer import FlashInferAttentionBackend as FI

    if FI.is_available():
        fi = FI(num_heads=hq, head_size=d, num_kv_heads=hkv, scale=d**-0.5)
        fmd = FI.build_metadata(case.layout, torch.device("cuda"))
        fout = fi.forward(case.query, case.key, case.value, case.kv_cache, fmd)
        eager["flashinfer_rel_err"] = rel_err(fout, reference(case, d**-0.5)) if not math.isnan(err) else None
        eager["flashinfer_eager_us"] = triton.testing.do_bench(
            lambda: fi.forward(case.query, case.key, case.value, case.kv_cache, fmd), return_mode="median") * 1e3
    return {"seqs": f"{len(seqs)}x(ctx {seqs[0][0]}, new {seqs[0][1]})", "triton_us": ms * 1e3,
            "rel_err": err, "kv_GBps": kv_bytes / (ms * 1e-3) / 1e9, "TFLOPs": flops / (ms * 1e-3) / 1e12,
            "sdpa_dense_us": sdpa_ms * 1e3 if sdpa_ms else None, **eager}


def synthetic_8b_decode(bw: float) -> dict:
    """Llama-3-8B shapes, random bf16 weights, batch 1, context 512: one decode step in a CUDA graph."""
    from octavo.plugins.attention.triton import TritonAttentionBackend

    L, hid, inter, vocab, hq, hkv, d = 32, 4096, 14336, 128256, 32, 8, 128
    dt, dev = torch.bfloat16, "cuda"

    def w(o, i):
        return torch.randn(o, i, dtype=dt, device=dev) * 0.02

    layers = [dict(qkv=w((hq + 2 * hkv) * d, hid), o=w(hid, hq * d), gu=w(2 * inter, hid), down=w(hid, inter))
              for _ in range(L)]
    emb, head = w(vocab, hid), w(vocab, hid)
    weight_bytes = sum(t.numel() * 2 for lw in layers for t in lw.values()) + emb.numel() * 2 + head.numel() * 2
    ctx_len, bs = 512, 16
    nb = ctx_len // bs + 2
    caches = [torch.randn(2, nb, bs, hkv, d, dtype=dt, device=dev) for _ in range(L)]
    be = TritonAttentionBackend(num_heads=hq, head_size=d, num_kv_heads=hkv, scale=d**-0.5)
    from octavo.attention import AttentionLayout

    layout = AttentionLayout(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([ctx_len], dtype=torch.int32),
                             torch.tensor([ctx_len - 1], dtype=torch.int32),
                             torch.arange(1, nb, dtype=torch.int32)[None], torch.tensor([bs + ctx_len - 1]),
                             bs, 1, 2048, 1)
    md = TritonAttentionBackend.build_metadata(layout, torch.device(dev))
    ids = torch.tensor([7], device=dev)
    F = torch.nn.functional

    def rms(x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)

    def step():
        x = F.embedding(ids, emb)
        for lw, kv in zip(layers, caches):
            qkv = F.linear(rms(x), lw["qkv"])
            q, k, v = qkv.split([hq * d, hkv * d, hkv * d], -1)
            a = be.forward(q.view(1, hq, d), k.view(1, hkv, d), v.view(1, hkv, d), kv, md)
            x = x + F.linear(a.view(1, -1), lw["o"])
            g, u = F.linear(rms(x), lw["gu"]).chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, lw["down"])
        return F.linear(rms(x), head).argmax(-1)

    ms = bench(step, rep=500)
    kv_bytes = L * ctx_len * hkv * d * 2 * 2
    roof_ms = (weight_bytes + kv_bytes) / bw * 1e3
    # GEMV alone: the biggest matrix, to see cuBLAS's own bandwidth at batch 1
    xg = torch.randn(1, hid, dtype=dt, device=dev)
    gemv_ms = bench(lambda: F.linear(xg, layers[0]["gu"]))
    return {"weights_GB": weight_bytes / 1e9, "step_ms": ms, "roofline_ms": roof_ms,
            "fraction_of_roofline": roof_ms / ms,
            "gemv_28672x4096_GBps": layers[0]["gu"].numel() * 2 / (gemv_ms * 1e-3) / 1e9}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-8b", action="store_true")
    args = ap.parse_args()
    import triton

    props = torch.cuda.get_device_properties(0)
    res = {"torch": torch.__version__, "triton": triton.__version__, "sms": props.multi_processor_count}
    bw = copy_bandwidth()
    res["copy_bandwidth_TBps"] = bw / 1e12
    res["matmul_bf16_TFLOPs"] = matmul_tflops()
    print(f"card {props.name}: copy {bw / 1e12:.2f} TB/s, bf16 matmul {res['matmul_bf16_TFLOPs']:.0f} TFLOP/s",
          flush=True)
    cases = {
        "decode_bs1_ctx1k": [(1023, 1)], "decode_bs1_ctx8k": [(8191, 1)], "decode_bs32_ctx1k": [(1023, 1)] * 32,
        "decode_bs64_ctx2k": [(2047, 1)] * 64, "decode_bs256_ctx1k": [(1023, 1)] * 256,
        "prefill_1x4096": [(0, 4096)], "prefill_4x1024": [(0, 1024)] * 4,
        "chunk_512_over_7680": [(7680, 512)], "mixed_64dec_1chunk": [(1000, 1)] * 64 + [(1024, 1024)],
    }
    res["attention"] = {}
    for name, seqs in cases.items():
        r = attention_case(seqs)
        r["kv_fraction_of_copy_bw"] = r["kv_GBps"] * 1e9 / bw
        res["attention"][name] = r
        print(f"{name:22s} triton {r['triton_us']:9.1f} us  err {r['rel_err']:.1e}  KV {r['kv_GBps']:7.0f} GB/s "
              f"({r['kv_fraction_of_copy_bw']:.2f} of copy)  {r['TFLOPs']:6.1f} TFLOP/s  sdpa(dense) "
              f"{r['sdpa_dense_us'] or float('nan'):9.1f} us | eager: triton {r['triton_eager_us']:8.1f} us, "
              f"flashinfer {r.get('flashinfer_eager_us') or float('nan'):8.1f} us", flush=True)
    if not args.skip_8b:
        res["synthetic_8b_decode_bs1"] = r8 = synthetic_8b_decode(bw)
        print(f"synthetic 8B decode bs1: {r8['step_ms']:.2f} ms/step, roofline {r8['roofline_ms']:.2f} ms -> "
              f"{r8['fraction_of_roofline']:.3f}; GEMV 28672x4096 at {r8['gemv_28672x4096_GBps']:.0f} GB/s", flush=True)
    if args.out:
        commit = os.environ.get("OCTAVO_COMMIT") or subprocess.run(  # the device copy has no .git
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        rec = {"card": props.name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "command": " ".join(["python"] + sys.argv), "commit": commit or None, "results": res}
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x)


if __name__ == "__main__":
    main()
