"""The transformers peer of ``gpu_e2e.py``'s tasks, on the same card in the same call: batch-1 decode on the
Llama-3-8B shape (``tf_decode_bs1``), nano-vllm's workload on the Qwen3-0.6B shape (``tf_qwen3_nanovllm``) and
batched generate on the 8B shape (``tf_8b_throughput``). Random weights, bf16, greedy.
"""

from __future__ import annotations

import json
import random
import time

from gpu_e2e_common import LLAMA3_8B, QWEN3_0P6B, nanovllm_workload


def task_tf_decode_bs1(args, tmp) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(**{k: v for k, v in LLAMA3_8B.items() if k not in ("architectures", "model_type", "torch_dtype")})
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.randint(1000, 120000, (1, 512), device="cuda")

    def run(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    run(4)
    t1, t2 = run(1), run(129)
    res = {"tf_decode_ms_per_token": (t2 - t1) / 128 * 1e3}
    print(json.dumps(res), flush=True)
    return res


def _tf_batched(model, reqs, batch, pad_id=0) -> tuple[float, int]:
    """Left-padded batched greedy generate; counts only each request's own output length."""
    import torch

    total_t, total_tok = 0.0, 0
    for i in range(0, len(reqs), batch):
        chunk = reqs[i:i + batch]
        width = max(len(ids) for ids, _ in chunk)
        inp = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(inp)
        for j, (ids, _) in enumerate(chunk):
            inp[j, width - len(ids):] = torch.tensor(ids)
            mask[j, width - len(ids):] = 1
        new = max(n for _, n in chunk)
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(inp.cuda(), attention_mask=mask.cuda(), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, pad_token_id=pad_id)
        torch.cuda.synchronize()
        total_t += time.perf_counter() - t
        total_tok += sum(n for _, n in chunk)
    return total_t, total_tok


def task_tf_qwen3_nanovllm(args, tmp) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{k: v for k, v in QWEN3_0P6B.items() if k not in ("architectures", "torch_dtype")})
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    reqs = nanovllm_workload()[: args.tf_requests]
    _tf_batched(model, [(reqs[0][0][:50], 4)], 1)  # warm-up
    dt, tok = _tf_batched(model, reqs, args.tf_batch)
    res = {"tf_requests": len(reqs), "tf_batch": args.tf_batch, "tf_output_tokens": tok, "tf_seconds": dt,
           "tf_qwen3_nanovllm_tok_s": tok / dt}
    print(json.dumps(res), flush=True)
    return res


def task_tf_8b_throughput(args, tmp) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(**{k: v for k, v in LLAMA3_8B.items() if k not in ("architectures", "model_type", "torch_dtype")})
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    rng = random.Random(1)
    reqs = [([rng.randrange(1000, 120000) for _ in range(1000)], args.tf_8b_new) for _ in range(64)]
    dt, tok = _tf_batched(model, reqs, 64)
    res = {"tf_8b_prompts": 64, "tf_8b_new_tokens": args.tf_8b_new, "tf_8b_tok_s": tok / dt}
    print(json.dumps(res), flush=True)
    return res
