"""GPU checks and benchmarks of the quantizers, in one process (one device call).

    python benchmarks/quant_gpu.py --out results.json [--prompts 256 --in-len 512 --out-len 256]

1. correctness on tiny random Llama checkpoints (model level, reference attention): ``fp8`` quantized while
   loading, a pre-quantized FP8 checkpoint, and GPTQ int4 on the CUDA tinygemm kernel, each against the
   dense run of its dequantized weights (greedy tokens, logits relative to the max |logit|);
2. the fused fp8 activation-quantization Triton kernel vs its torch reference on the device (bit mismatches);
3. Llama-3-8B shape, dummy weights, same call, same card: batch-1 decode ms/token and its fraction of the
   roofline (weight bytes read per step / copy bandwidth measured here) for bf16, fp8 with the fused Triton
   activation quantization, and fp8 with torch-op quantization (``OCTAVO_FP8_FUSED_QUANT=0``); a batched
   offline run for the ``--offline`` variants (default bf16 and fp8).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import random
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

LLAMA3_8B = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                 max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, hidden_act="silu",
                 tie_word_embeddings=False, torch_dtype="bfloat16")


class CUDAPlatform:
    name, device_type = "cuda", "cuda"


def load_cuda(path: str, quantization, dtype=torch.bfloat16):
    from octavo.config import OctavoSettings
    from octavo.core.loader import load_model, resolve_model
    from octavo.core.loader.quant import resolve_quantizer
    from octavo.core.plugin_manager import get_plugin_manager

    resolved = resolve_model(OctavoSettings.from_kwargs(model=path).model)
    pm = get_plugin_manager()
    quantizer = resolve_quantizer(quantization, resolved, CUDAPlatform(), pm)
    return load_model(resolved, model_cls=pm.resolve("models", resolved.architecture), dtype=dtype,
                      device="cuda", quantizer=quantizer)


def compare(quantized, dense, prompts, steps=12) -> dict:
    from octavo.testing.model import PagedRunner

    runner_d = PagedRunner(dense, num_blocks=64, device="cuda")
    runner_q = PagedRunner(quantized, num_blocks=64, device="cuda")
    want = []
    for p in prompts:  # dense greedy, then the quantized model under the same context
        toks = list(p)
        for _ in range(steps):
            toks.append(int(runner_d.prompts([toks])[0][-1].argmax()))
        want.append(toks)
    got_d = runner_d.prompts(want)
    got_q = runner_q.prompts(want)
    agree, total, worst = 0, 0, 0.0
    for p, d, q in zip(prompts, got_d, got_q):
        d, q = d[len(p) - 1:-1], q[len(p) - 1:-1]
        agree += int((d.argmax(-1) == q.argmax(-1)).sum())
        total += d.shape[0]
        worst = max(worst, float(((d - q).abs().amax(-1) / d.abs().amax(-1)).max()))
    return {"agreement": agree / total, "worst_logit_diff_rel": worst}


def correctness(tmp: str) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from tests.quant.formats import gptq_tensors, write_checkpoints

    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn_like(p) * 0.08)
    prompts = [[1, 17, 93, 250, 7], [1, 400, 401, 402], [5, 6, 7, 8, 9, 10, 11, 12], [300]]
    out = {}

    def fp8_online(w, i):
        q, s = quantize_fp8_rows(w)
        return {"weight": w}, q.float() * s[:, None]

    def fp8_pre(w, i):
        q, s = quantize_fp8_rows(w)
        return {"weight": q, "weight_scale": s}, q.float() * s[:, None]

    cases = {"fp8-online": (None, fp8_online, "fp8"),
             "fp8-prequantized": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, fp8_pre, None),
             "gptq-int4-cuda": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False},
                                lambda w, i: gptq_tensors(w, 128, False, False), None)}
    for name, (qc, make, setting) in cases.items():
        try:
            qdir, ddir = write_checkpoints(hf, tmp, name, qc, make)
            res = compare(load_cuda(qdir, setting), load_cuda(ddir, None, torch.float32), prompts)
        except Exception as e:  # noqa: BLE001 - reported in the JSON
            res = {"error": f"{type(e).__name__}: {e}"}
        out[name] = res
        print(name, json.dumps(res), flush=True)
    return out


def fused_quant_check() -> dict:
    from octavo.plugins.quant.fp8_triton import quantize_per_token, quantize_per_token_torch

    out = {}
    for m, k in [(1, 4096), (7, 14336), (512, 4096)]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 3
        q, s = quantize_per_token(x)
        rq, rs = quantize_per_token_torch(x)
        diff = (q.float() - rq.float()).abs()
        out[f"{m}x{k}"] = {"scale_max_rel_diff": float(((s - rs).abs() / rs).max()),
                           "elements_differing": int((diff > 0).sum()), "elements": m * k}
    print("fused fp8 quant vs torch", json.dumps(out), flush=True)
    return out


def copy_bandwidth() -> float:
    """Device memory bandwidth in bytes/s from a 2 GiB copy (read + write), best of 5."""
    a = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    del a, b
    return 2 * (2 << 30) / best


def step_bytes(cfg: dict, fp8: bool) -> int:
    """Bytes a batch-1 decode step reads: the linear weights (1 byte fp8, 2 bf16) and the bf16 LM head."""
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    linear = n * (h * (h + 2 * kv) + h * h + 3 * h * i)
    return linear * (1 if fp8 else 2) + cfg["vocab_size"] * h * 2


def bench(tmp: str, args) -> dict:
    from octavo import LLM, SamplingParams

    d = os.path.join(tmp, "llama3-8b")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(LLAMA3_8B, f)
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(1000, 120000) for _ in range(args.in_len)]}
               for _ in range(args.prompts)]
    one = [{"prompt_token_ids": prompts[0]["prompt_token_ids"]}]
    bandwidth = copy_bandwidth()
    out = {"copy_bandwidth_GBps": bandwidth / 1e9}
    for name in args.variants.split(","):
        os.environ["OCTAVO_FP8_FUSED_QUANT"] = "0" if name == "fp8-unfused" else "1"
        try:
            t0 = time.perf_counter()
            llm = LLM(model=d, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                      max_model_len=2048, gpu_memory_utilization=0.9,
                      quantization=None if name == "bf16" else "fp8")
            res = {"load_s": time.perf_counter() - t0}
            llm.generate(one, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)  # warm-up
            times = {1: [], 129: []}  # best of 3 each: a one-off cost in one run must not bias the difference
            for _ in range(3):
                for n in (1, 129):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    llm.generate(one, SamplingParams(max_tokens=n, ignore_eos=True), use_tqdm=False)
                    torch.cuda.synchronize()
                    times[n].append(time.perf_counter() - t)
            res["bs1_runs_s"] = {str(n): [round(x, 4) for x in v] for n, v in times.items()}
            res["bs1_ms_per_token"] = (min(times[129]) - min(times[1])) / 128 * 1e3
            roofline_ms = step_bytes(LLAMA3_8B, name != "bf16") / bandwidth * 1e3
            res["bs1_roofline_ms"] = roofline_ms
            res["bs1_fraction_of_roofline"] = roofline_ms / res["bs1_ms_per_token"]
            print(name, json.dumps(res), flush=True)
            if name in args.offline.split(","):
                torch.cuda.synchronize()
                t = time.perf_counter()
                outs = llm.generate(prompts, SamplingParams(max_tokens=args.out_len, ignore_eos=True),
                                    use_tqdm=False)
                torch.cuda.synchronize()
                dt = time.perf_counter() - t
                total = sum(len(o.outputs[0].token_ids) for o in outs)
                res.update({"offline_s": dt, "output_tok_s": total / dt, "workload": f"{args.prompts} x "
                            f"{args.in_len}/{args.out_len}"})
            del llm
            gc.collect()
        except Exception as e:  # noqa: BLE001 - reported in the JSON
            res = {"error": f"{type(e).__name__}: {e}"}
        torch.cuda.empty_cache()
        out[name] = res
        print(name, json.dumps(res), flush=True)
    if "output_tok_s" in out.get("fp8", {}) and "output_tok_s" in out.get("bf16", {}):
        out["fp8_over_bf16_throughput"] = out["fp8"]["output_tok_s"] / out["bf16"]["output_tok_s"]
    for name in ("fp8", "fp8-unfused"):
        if "bs1_ms_per_token" in out.get(name, {}) and "bs1_ms_per_token" in out.get("bf16", {}):
            out[f"{name}_over_bf16_bs1_speed"] = out["bf16"]["bs1_ms_per_token"] / out[name]["bs1_ms_per_token"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="quant_gpu.json")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--in-len", type=int, default=512)
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--variants", default="bf16,fp8,fp8-unfused", help="batch-1 decode variants")
    ap.add_argument("--offline", default="bf16,fp8", help="variants that also run the offline workload")
    args = ap.parse_args()
    os.environ.setdefault("OCTAVO_DISABLE_PROGRESS", "1")
    record = {"card": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv)}
    with tempfile.TemporaryDirectory() as tmp:
        record["correctness"] = correctness(tmp)
        try:
            record["fused_fp8_quant"] = fused_quant_check()
        except Exception as e:  # noqa: BLE001 - reported in the JSON
            record["fused_fp8_quant"] = {"error": f"{type(e).__name__}: {e}"}
        if not args.skip_bench:
            record["llama3_8b_shape"] = bench(tmp, args)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
