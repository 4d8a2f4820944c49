"""Qwen2-VL at tensor parallel 2 (mp executor, gloo): the image items (pixels + grids) cross to both worker
processes as step-contract data, the vision tower runs replicated, the M-RoPE language model sharded; greedy
tokens equal transformers. Full mode only (``make multimodal``: two worker processes on the 2-core CI)."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("OCTAVO_MULTIMODAL") != "full",
                                reason="full multimodal suite only (make multimodal / OCTAVO_MULTIMODAL=full)")

V = "<|vision_start|><|image_pad|><|vision_end|>"


def test_tp2_greedy_equals_transformers(tmp_path):
    from octavo import LLM, SamplingParams
    from tests.multimodal.tiny_llava import make_image
    from tests.multimodal.tiny_qwen2vl import build_tiny_qwen2vl

    path, model, reference = build_tiny_qwen2vl(tmp_path)
    cases = [(f"USER: {V} w1 w2 w3 ASSISTANT:", [make_image(0, (56, 84))]), ("USER: w9 w10 ASSISTANT:", []),
             (f"USER: w7 {V} w4 {V} w5 ASSISTANT:", [make_image(1, (120, 90)), make_image(2, (150, 100))])]
    llm = LLM(model=str(path), dtype="float32", tensor_parallel_size=2, limit_mm_per_prompt={"image": 2},
              max_num_batched_tokens=24, enable_chunked_prefill=True, kv_cache_memory_bytes=1 << 26)
    try:
        outs = llm.generate([{"prompt": p, "multi_modal_data": {"image": i}} if i else p for p, i in cases],
                            SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), use_tqdm=False)
        stats = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    finally:
        llm.llm_engine.shutdown()  # the worker processes
    for (prompt, imgs), out in zip(cases, outs):
        inputs = reference(prompt, imgs or None)
        with torch.no_grad():
            ref = model.generate(**inputs, max_new_tokens=6, do_sample=False)[0, inputs["input_ids"].shape[1]:]
        assert list(out.outputs[0].token_ids) == ref.tolist(), prompt
    assert stats["octavo:mm_items_encoded"] == 3  # counted on rank 0's runner, reported through the executor
