"""Qwen2.5-VL against transformers (tiny random-weight checkpoint built here): its windowed ViT gives the
same image embeddings as ``Qwen2_5_VLModel.visual`` (windows of 2x2 merged patches, one full-attention block),
and fp32 greedy tokens equal ``generate`` with 1 and 2 images of different sizes batched with a text-only
prompt under a budget that splits images across steps. (The language side, M-RoPE and the processor are
Qwen2-VL's, tested in depth in test_qwen2_vl.py.)"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("PIL.Image")

V = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tests.multimodal.tiny_qwen2vl import build_tiny_qwen2vl

    return build_tiny_qwen2vl(tmp_path_factory.mktemp("tiny-qwen25vl"), version="2.5")


@pytest.fixture(scope="module")
def llm(ckpt):
    from octavo import LLM

    return LLM(model=str(ckpt[0]), dtype="float32", limit_mm_per_prompt={"image": 2}, max_num_batched_tokens=24,
               enable_chunked_prefill=True, max_num_seqs=4)


def _images():
    from tests.multimodal.tiny_llava import make_image

    return make_image(0, (56, 84)), make_image(1, (120, 90)), make_image(2, (150, 100))


def test_window_vision_tower_equals_transformers(ckpt, llm):
    _, model, reference = ckpt
    imgs = list(_images()[1:])
    inputs = reference(f"{V} {V}", imgs)
    with torch.no_grad():
        ref = model.model.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]).pooler_output
    ours = llm.llm_engine.core.executor.driver.runner.model.embed_images(inputs["pixel_values"],
                                                                         inputs["image_grid_thw"].tolist())
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-5)


def test_greedy_matches_transformers_batched_with_text_only(ckpt, llm):
    from octavo import SamplingParams

    _, model, reference = ckpt
    a, b, c = _images()
    cases = [(f"USER: {V} w1 w2 w3 ASSISTANT:", [a]), ("USER: w9 w10 w11 ASSISTANT:", []),
             (f"USER: w7 {V} w4 {V} w5 w6 ASSISTANT:", [b, c])]
    outs = llm.generate([{"prompt": p, "multi_modal_data": {"image": i}} if i else p for p, i in cases],
                        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), use_tqdm=False)
    for (prompt, imgs), out in zip(cases, outs):
        inputs = reference(prompt, imgs or None)
        with torch.no_grad():
            ref = model.generate(**inputs, max_new_tokens=8, do_sample=False)[0, inputs["input_ids"].shape[1]:]
        assert list(out.outputs[0].token_ids) == ref.tolist(), prompt
