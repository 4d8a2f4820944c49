"""Qwen2-VL and Qwen2.5-VL on the device (issue 14): the tiny random-weight checkpoints of tests/multimodal, octavo's default
GPU path (Triton attention, CUDA graphs for decode, so M-RoPE decode positions go through the graph runner)
in float32, greedy tokens vs transformers ``generate`` on the same card, prompts with 1 and 2 images of
different sizes and a text-only prompt in one batch. Writes one JSON.

    python benchmarks/device/mm_qwen2vl_check.py --out /tmp/q.json [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests.multimodal

V = "<|vision_start|><|image_pad|><|vision_end|>"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--versions", default="2,2.5")
    args = p.parse_args()
    records = [check(args, v) for v in args.versions.split(",")]
    with open(args.out, "w") as f:
        json.dump(records, f, indent=2)
    print(json.dumps([{k: v for k, v in r.items() if k not in ("octavo", "transformers")} for r in records], indent=2))


def check(args, version: str) -> dict:
    import torch

    from octavo import LLM, SamplingParams
    from tests.multimodal.tiny_llava import make_image
    from tests.multimodal.tiny_qwen2vl import build_tiny_qwen2vl

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        path, model, reference = build_tiny_qwen2vl(root, version)
        model = model.to(args.device)
        cases = [(f"USER: {V} w1 w2 w3 ASSISTANT:", [make_image(0, (56, 84))]),
                 ("USER: w9 w10 w11 ASSISTANT:", []),
                 (f"USER: w7 {V} w4 {V} w5 w6 ASSISTANT:", [make_image(1, (120, 90)), make_image(2, (150, 100))])]
        refs = []
        for prompt, imgs in cases:
            inputs = {k: v.to(args.device) for k, v in reference(prompt, imgs or None).items()}
            with torch.no_grad():
                out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
            refs.append(out[0, inputs["input_ids"].shape[1]:].tolist())
        llm = LLM(model=str(path), dtype="float32", device=args.device, limit_mm_per_prompt={"image": 2},
                  max_num_batched_tokens=24, enable_chunked_prefill=True, max_num_seqs=4)
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        prompts = [{"prompt": pr, "multi_modal_data": {"image": im}} if im else pr for pr, im in cases]
        outs = llm.generate(prompts, params, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outs]
        runner = llm.llm_engine.core.executor.driver.runner
        graph = getattr(runner.graph_runner, "num_replays", None)
        record = {"check": f"Qwen{version}-VL tiny fp32 greedy vs transformers", "device": args.device,
                  "torch": torch.__version__, "equal": got == refs, "octavo": got, "transformers": refs,
                  "cuda_graph_replays": graph, "attention_backend": llm.llm_engine.model_info.attention_backend
                  if hasattr(llm.llm_engine.model_info, "attention_backend") else None,
                  "encoder_cache": {"encoded": runner.encoder_cache.encoded, "hits": runner.encoder_cache.hits},
                  "wall_s": round(time.perf_counter() - t0, 1)}
    print(json.dumps({k: v for k, v in record.items() if k not in ("octavo", "transformers")}), flush=True)
    with open(args.out, "w") as f:  # written at once: the process may be cut off while exiting
        json.dump([record], f, indent=2)
    return record


if __name__ == "__main__":
    main()
