"""MoE offline throughput for ``moe_e2e.py``: octavo ``LLM.generate`` on random prompts (``tput``) and transformers
``generate`` on the same config and layer count in the same process (``tf``); see ``moe_e2e.py``'s docstring."""

from __future__ import annotations

import contextlib
import random
import time

from moe_common import _free, _sync, config, gen_timed, make_llm


def _prompts(num, length, vocab, seed=1):
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(num)]


def task_tput(args, shape, layers, tmp) -> dict:
    cfg = config(shape, layers, args.tiny)
    llm, load_s = make_llm(cfg, tmp, f"{shape}-{layers}-tput", max_model_len=args.in_len + args.out_len + 16,
                           max_num_seqs=args.prompts, gpu_memory_utilization=0.9)
    res = measure_tput(args, shape, layers, cfg, llm, load_s)
    llm.llm_engine.shutdown()
    del llm
    _free()
    return res


def measure_tput(args, shape, layers, cfg, llm, load_s) -> dict:
    from octavo import SamplingParams

    prompts = [{"prompt_token_ids": p} for p in _prompts(args.prompts, args.in_len, cfg["vocab_size"])]
    gen_timed(llm, prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    res = {"shape": shape, "layers": layers, "load_s": load_s, "prompts": args.prompts, "in_len": args.in_len}
    short = TF_OUT.get(shape, args.short_out_len)  # what transformers ran, or what it will try first
    lengths = [args.out_len] + ([short] if short and short != args.out_len else [])
    for out_len in lengths:
        dt, outs = gen_timed(llm, prompts, SamplingParams(max_tokens=out_len, ignore_eos=True))
        tok = sum(len(o.outputs[0].token_ids) for o in outs)
        res[f"out_{out_len}"] = {"seconds": dt, "output_tokens": tok, "output_tok_s": tok / dt,
                                 "total_tok_s": (tok + args.prompts * args.in_len) / dt}
        print(f"  octavo {shape} {layers}L {args.prompts}x{args.in_len}/{out_len}: {tok / dt:.0f} output tok/s",
              flush=True)
    return res


TF_OUT: dict[str, int] = {}  # output length transformers could run, per shape (tput runs it too)


def task_tf(args, shape, layers, tmp) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = config(shape, layers, args.tiny)
    hf = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")},
                              experts_implementation="grouped_mm")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t = time.perf_counter()
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16).eval()
    load_s = time.perf_counter() - t
    # transformers 5.x switches grouped_mm to batched_mm while decoding on a GPU; batched_mm copies every
    # slot's expert weights (Mixtral at batch 256: 512 x 235 MB per layer call), so keep grouped_mm
    switch_off = hasattr(model, "_optimize_model_for_decode")
    if switch_off:
        model._optimize_model_for_decode = contextlib.nullcontext
    ids = torch.tensor(_prompts(args.prompts, args.in_len, cfg["vocab_size"]), device=dev)
    mask = torch.ones_like(ids)

    def run(new, prompts=args.prompts, model=model, ids=ids):
        _sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids[:prompts], attention_mask=mask[:prompts], max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False, pad_token_id=0)
        _sync()
        assert out.shape == (prompts, args.in_len + new), out.shape
        return time.perf_counter() - t0

    t_start = time.perf_counter()
    probe = run(8)  # prefill + 7 decode steps (also the warm-up)
    step = max((run(16) - probe) / 8, 1e-4) if probe < args.tf_budget_s / 4 else probe / 8
    fits = int((args.tf_budget_s - probe) / step) if step else args.out_len
    out_len, prompts, small = None, args.prompts, {}
    if args.out_len <= fits:
        out_len = args.out_len
    elif args.tf_fewer_prompts and args.prompts > 16:
        # the full output length for fewer requests (the rate is then per useful output token of fewer rows).
        # Measure 16 requests' prefill and decode step, take a batch of p's step as growing linearly from 16's
        # to the full batch's upper bound above (conservative), and run the largest p that fits what is left.
        p8 = run(8, 16)
        step16 = max((run(16, 16) - p8) / 8, 1e-4)
        pre16 = max(p8 - 7 * step16, 0.0)
        left = args.tf_budget_s - (time.perf_counter() - t_start)
        small = {"tf_probe_16_prompts_8_tokens_s": p8, "tf_decode_step_16_prompts_s": step16}

        def cost(p):
            return pre16 * p / 16 + args.out_len * (step16 + (p - 16) / (args.prompts - 16) * max(step - step16, 0))

        prompts = next((p for p in (128, 64, 32, 16) if p < args.prompts and cost(p) <= left), args.prompts)
        out_len = args.out_len if prompts < args.prompts else None
    if out_len is None:  # the full batch: octavo's short run's length, else the longest that fits
        out_len = next((n for n in (args.short_out_len,) if n and n <= fits), max(8, fits // 8 * 8))
    dt = run(out_len, prompts) if out_len > 16 else probe * out_len / 8
    if prompts == args.prompts:
        TF_OUT[shape] = out_len
    impl = getattr(model, "get_experts_implementation", lambda: None)()
    res = {"shape": shape, "layers": layers, "load_s": load_s, "prompts": args.prompts, "in_len": args.in_len,
           "tf_prompts": prompts, "tf_out_len": out_len, "tf_seconds": dt, "tf_output_tok_s": prompts * out_len / dt,
           "tf_probe_8_tokens_s": probe, "tf_decode_step_s": step, "experts_implementation": impl,
           "decode_switch_to_batched_mm_disabled": switch_off, **small}
    print(f"  transformers {shape} {layers}L {prompts}x{args.in_len}/{out_len}: "
          f"{res['tf_output_tok_s']:.0f} output tok/s", flush=True)
    del model, ids
    _free()
    return res
