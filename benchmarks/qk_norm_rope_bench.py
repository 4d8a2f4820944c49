"""Qwen3 attention between the qkv GEMM and attention: the eager path (the ``cuda_fusions`` RMSNorm and rotary
kernels plus the copies of the strided q/k slices) vs the one-kernel ``cuda_qk_norm_rope``, Qwen3-0.6B shape
(16 q / 8 KV heads of 128), bf16. Each variant is captured 28 times (one per layer) in one CUDA graph and the
replay timed: microseconds per decode step, as inside the model's decode graph.

    python benchmarks/qk_norm_rope_bench.py --tokens 1 64 139 256 --out /tmp/qk.json
"""

from __future__ import annotations

import argparse
import json
import types


def bench(tokens: list[int], layers: int = 28) -> dict:
    """Eager vs fused per decode step (µs, ``layers`` calls in one graph) for each token count."""
    import torch

    from octavo.nn.layernorm import RMSNorm
    from octavo.nn.rotary import RotaryEmbedding, compute_cos_sin
    from octavo.plugins.platforms.cuda_fusions import fuse_model
    from octavo.plugins.platforms.cuda_qk_norm_rope import qk_norm_rope

    dev, dt, head, hq, hk = torch.device("cuda"), torch.bfloat16, 128, 16, 8
    cos, sin = compute_cos_sin(head, 40960, 1e6)
    a = types.SimpleNamespace(head_dim=head, num_heads=hq, num_kv_heads=hk, q_size=hq * head, kv_size=hk * head,
                              rotary_emb=RotaryEmbedding(head, head, cos, sin).to(dev),
                              q_norm=RMSNorm(head, eps=1e-6).to(dev, dt), k_norm=RMSNorm(head, eps=1e-6).to(dev, dt))
    for mod in (a.rotary_emb, a.q_norm, a.k_norm):
        fuse_model(mod, dt, dev)

    def eager(pos, qkv):
        n = qkv.shape[0]
        q, k, _ = qkv.split([a.q_size, a.kv_size, a.kv_size], dim=-1)
        q = a.q_norm(q.reshape(n, hq, head)).reshape(n, a.q_size)
        k = a.k_norm(k.reshape(n, hk, head)).reshape(n, a.kv_size)
        return a.rotary_emb(pos, q, k)

    def fused(pos, qkv):
        return qk_norm_rope(a, pos, qkv)

    results = []
    for n in tokens:
        qkv = torch.randn(n, a.q_size + 2 * a.kv_size, device=dev).to(dt)
        pos = torch.randint(0, 4096, (n,), device=dev)
        row = {"tokens": n}
        for name, fn in (("eager", eager), ("fused", fused)):
            fn(pos, qkv)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(layers):
                    fn(pos, qkv)
            g.replay()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                g.replay()
            end.record()
            torch.cuda.synchronize()
            row[f"{name}_us_per_step"] = start.elapsed_time(end) / 20 * 1e3
        row["saved_us_per_step"] = row["eager_us_per_step"] - row["fused_us_per_step"]
        print(json.dumps(row), flush=True)
        results.append(row)
    return {"card": torch.cuda.get_device_name(), "command": "python benchmarks/qk_norm_rope_bench.py",
            "layers": layers, "results": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 139, 256])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rec = bench(args.tokens, args.layers)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
