"""Greedy parity of octavo on the GPU with Hugging Face transformers, on small random-weight checkpoints
built on the spot (Llama; Qwen3 too once octavo registers ``Qwen3ForCausalLM``).

Both run in bf16. Tokens must be identical up to the first step where transformers' own top-2 logit margin
is within bf16 noise (``MARGIN``); past that point the two may legitimately continue differently, so the
comparison of that prompt stops there. Log-probabilities of the agreed tokens must be close.
"""

from __future__ import annotations

import os
import random

MARGIN = 0.1  # logits closer than this may swap order under bf16 rounding
# bf16 logits here span ~15 units; a few bf16 ulps (2^-8 relative) of that, accumulated over the layers.
# Measured on an H100: triton 0.092, torch_sdpa 0.124. A wrong mask or position is off by >1 and flips
# clear-margin tokens, which the token check catches first.
LOGPROB_TOL = 0.2


def build_checkpoint(root: str, arch: str) -> str:
    import torch
    import transformers

    common = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5,
                  initializer_range=0.08, tie_word_embeddings=False)
    if arch == "Qwen3ForCausalLM":
        cfg = transformers.Qwen3Config(head_dim=64, **common)
    else:
        cfg = transformers.LlamaConfig(**common)
    torch.manual_seed(0)
    model = getattr(transformers, arch)(cfg)
    path = os.path.join(root, arch)
    model.save_pretrained(path)
    return path


def hf_greedy(path: str, prompts: list[list[int]], max_new: int):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    results = []
    for ids in prompts:
        out = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=max_new, min_new_tokens=max_new,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        tokens = out.sequences[0, len(ids):].tolist()
        logits = torch.stack(out.logits)[:, 0].float()  # [steps, vocab]
        results.append((tokens, logits))
    del model
    torch.cuda.empty_cache()
    return results


def compare(octavo_outs, hf_results) -> dict:
    import torch

    agreed, diverged_ambiguous, max_lp_err = 0, 0, 0.0
    for out, (hf_tokens, logits) in zip(octavo_outs, hf_results):
        comp = out.outputs[0]
        for i, (a, b) in enumerate(zip(comp.token_ids, hf_tokens)):
            top2 = logits[i].topk(2).values
            if a != b:
                margin = float(top2[0] - top2[1])
                if margin >= MARGIN:
                    raise AssertionError(f"step {i}: octavo chose {a}, transformers {b} with a clear margin {margin:.3f}")
                diverged_ambiguous += 1
                break
            lp_hf = float(torch.log_softmax(logits[i], -1)[a])
            lp_oct = comp.logprobs[i][a].logprob
            max_lp_err = max(max_lp_err, abs(lp_hf - lp_oct))
            agreed += 1
    assert max_lp_err < LOGPROB_TOL, f"logprob difference {max_lp_err:.3f} >= {LOGPROB_TOL}"
    return {"agreed_tokens": agreed, "ambiguous_divergences": diverged_ambiguous, "max_logprob_err": max_lp_err}


def run_parity(root: str, max_new: int = 48) -> dict:
    """Every (architecture, engine mode) pair against transformers; raises on a real mismatch."""
    import gc

    import torch

    from octavo import LLM, SamplingParams
    from octavo.registry import names

    archs = ["LlamaForCausalLM"] + (["Qwen3ForCausalLM"] if "Qwen3ForCausalLM" in names("models")
                                    else [])
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 1024) for _ in range(rng.randint(3, 60))] for _ in range(6)]
    report = {}
    for arch in archs:
        path = build_checkpoint(root, arch)
        hf = hf_greedy(path, prompts, max_new)
        for mode, kw in {"triton+graphs": {}, "triton eager": {"enforce_eager": True},
                         "torch_sdpa eager": {"enforce_eager": True, "attention_backend": "torch_sdpa"}}.items():
            llm = LLM(model=path, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=1024,
                      kv_cache_memory_bytes=1 << 30, max_num_seqs=8, **kw)
            worker = llm.llm_engine.core.executor.driver  # the cuda platform prepared it (prepare_model)
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                                SamplingParams(max_tokens=max_new, temperature=0, logprobs=1, ignore_eos=True),
                                use_tqdm=False)
            res = compare(outs, hf)
            gr = worker.runner.graph_runner
            res["graph_replays"] = gr.num_replays if gr else 0
            res["backend"] = worker.attn_backend_cls.name
            report[f"{arch} {mode}"] = res
            print(arch, mode, res, flush=True)
            del llm, worker
            gc.collect()
            torch.cuda.empty_cache()
    return report
