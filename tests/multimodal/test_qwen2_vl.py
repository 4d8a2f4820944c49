"""Qwen2-VL end to end against transformers: a tiny random-weight checkpoint built here (2D-rotary ViT with
a patch merger + Qwen2 with M-RoPE), loaded by octavo, fp32 greedy tokens equal to
``Qwen2VLForConditionalGeneration.generate`` on prompts with 1 and 2 images of different sizes (dynamic
resolution: different placeholder counts), batched with a text-only prompt, with a token budget that splits
images across steps (M-RoPE positions across chunked prefill, decode continuing from the rope delta); the
encoder cache and the prefix cache are hit (asserted from their counters)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("PIL.Image")

MAX_NEW = 8
V = "<|vision_start|><|image_pad|><|vision_end|>"
PROMPT1 = f"USER: {V} w1 w2 w3 ASSISTANT:"
PROMPT2 = f"USER: w7 {V} w4 {V} w5 w6 ASSISTANT:"
TEXT = "USER: w9 w10 w11 ASSISTANT:"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tests.multimodal.tiny_qwen2vl import build_tiny_qwen2vl

    return build_tiny_qwen2vl(tmp_path_factory.mktemp("tiny-qwen2vl"))


@pytest.fixture(scope="module")
def llm(ckpt):
    from octavo import LLM

    # a 24-token budget: the 2-image prompt (12 + 6 placeholders + text) runs over several steps, mid-image
    return LLM(model=str(ckpt[0]), dtype="float32", limit_mm_per_prompt={"image": 2}, max_num_batched_tokens=24,
               enable_chunked_prefill=True, max_num_seqs=4, block_size=16,
               allowed_media_domains=["127.0.0.1"])  # the SDK side of --allowed-media-domains


def _image(seed: int, size: tuple[int, int]):
    from tests.multimodal.tiny_llava import make_image

    return make_image(seed, size)


def _reference(ckpt, prompt: str, images: list, max_new: int = MAX_NEW) -> list[int]:
    _, model, reference = ckpt
    inputs = reference(prompt, images or None)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def _stats(llm) -> dict:
    """The engine's counters as the public metrics report them (``LLM.get_metrics``, /metrics names)."""
    return {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}


def test_greedy_matches_transformers_batched_with_text_only(ckpt, llm):
    from octavo import SamplingParams

    # three sizes -> 6, 12 and 20 placeholders (transformers' smart_resize decides the grid)
    img_a, img_b, img_c = _image(0, (56, 84)), _image(1, (120, 90)), _image(2, (150, 100))
    cases = [(PROMPT1, [img_a]), (TEXT, []), (PROMPT2, [img_b, img_c])]
    prompts = [{"prompt": p, "multi_modal_data": {"image": imgs}} if imgs else p for p, imgs in cases]
    before = _stats(llm)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    counts = set()
    for (prompt, imgs), out in zip(cases, outs):
        ref = _reference(ckpt, prompt, imgs)
        assert list(out.outputs[0].token_ids) == ref, (prompt, out.outputs[0].token_ids, ref)
        expanded = ckpt[2](prompt, imgs or None)["input_ids"][0].tolist()
        assert list(out.prompt_token_ids) == expanded  # the same dynamic-resolution expansion
        counts.add(expanded.count(299))
    assert len(counts) == 3  # text-only, and two prompts whose images expand to different counts
    after = _stats(llm)
    # each image ran through the vision tower exactly once; the chunked 2-image prompt reused an encoded
    # image in a later step (the encoder cache)
    assert after["octavo:mm_items_encoded"] - before["octavo:mm_items_encoded"] == 3
    assert after["octavo:mm_encoder_cache_hits"] - before["octavo:mm_encoder_cache_hits"] >= 1


def test_prefix_cache_hit_keeps_mrope_positions(ckpt, llm):
    """A second request with the same image and a longer text reuses the cached blocks (which hold K/V rotated
    at M-RoPE positions) and still equals transformers; a different image shares nothing."""
    from octavo import SamplingParams

    img, other = _image(5, (112, 112)), _image(6, (112, 112))
    words = " ".join(f"w{i}" for i in range(30))
    first = f"USER: {V} {words} ASSISTANT:"
    second = f"USER: {V} {words} w40 w41 ASSISTANT:"
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    llm.generate({"prompt": first, "multi_modal_data": {"image": img}}, params, use_tqdm=False)
    before = _stats(llm)
    same = llm.generate({"prompt": second, "multi_modal_data": {"image": img}}, params, use_tqdm=False)[0]
    hits = _stats(llm)["octavo:prefix_cache_hits"] - before["octavo:prefix_cache_hits"]
    diff = llm.generate({"prompt": second, "multi_modal_data": {"image": other}}, params, use_tqdm=False)[0]
    assert same.num_cached_tokens >= 32 and hits == same.num_cached_tokens  # 2+ full 16-token blocks past the image
    assert diff.num_cached_tokens == 0
    assert _stats(llm)["octavo:prefix_cache_hits"] - before["octavo:prefix_cache_hits"] == hits
    assert list(same.outputs[0].token_ids) == _reference(ckpt, second, [img], 6)
    assert list(diff.outputs[0].token_ids) == _reference(ckpt, second, [other], 6)


def test_chat_image_parts_and_errors(ckpt, llm):
    import base64
    import io

    from octavo import SamplingParams
    from octavo.errors import InputError

    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    img = _image(11, (84, 56))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": " w1 w2 w3"}]}]
    chat = llm.chat(msgs, params, use_tqdm=False)[0]  # the checkpoint's own chat template
    ref = _reference(ckpt, f"USER: {V} w1 w2 w3 ASSISTANT:", [img], 4)
    assert list(chat.outputs[0].token_ids) == ref
    from tests.multimodal.media_server import MediaServer

    with MediaServer({"/img.png": buf.getvalue()}) as srv:  # the same image over http from an allowed host
        msgs[0]["content"][0]["image_url"]["url"] = srv.url("/img.png")
        assert list(llm.chat(msgs, params, use_tqdm=False)[0].outputs[0].token_ids) == ref
        msgs[0]["content"][0]["image_url"]["url"] = srv.url("/img.png", host="localhost")
        with pytest.raises(InputError, match="'localhost' is not in --allowed-media-domains"):
            llm.chat(msgs, params, use_tqdm=False)
    with pytest.raises(InputError, match="placeholder"):
        llm.generate({"prompt": TEXT, "multi_modal_data": {"image": img}}, params)
    with pytest.raises(InputError, match="limit_mm_per_prompt"):
        llm.generate({"prompt": f"{V}{V}{V}", "multi_modal_data": {"image": [img] * 3}}, params)


def test_mrope_positions_equal_get_rope_index(ckpt):
    """core/multimodal_rope.py against transformers' get_rope_index on the 2-image prompt, split at every chunk
    boundary, and the decode delta."""
    import numpy as np

    from octavo.core.multimodal_rope import request_rope_positions
    from octavo.step import MultiModalInput

    _, model, reference = ckpt
    imgs = [_image(1, (120, 90)), _image(2, (150, 100))]
    inputs = reference(PROMPT2, imgs)
    ref, delta = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                            image_grid_thw=inputs["image_grid_thw"])
    ids = inputs["input_ids"][0].tolist()
    starts = [i for i, t in enumerate(ids) if t == 299 and (i == 0 or ids[i - 1] != 299)]
    items = [MultiModalInput("image", str(k), s, int(g.prod()) // 4, b"", "float32", [], g.tolist())
             for k, (s, g) in enumerate(zip(starts, inputs["image_grid_thw"]))]
    n = len(ids)
    for split in range(1, n):
        got = [request_rope_positions(a, b - a, items, 2) for a, b in ((0, split), (split, n))]
        rows = np.concatenate([r if r is not None else np.broadcast_to(t, (3, len(t))) for t, r in got], axis=1)
        assert (rows == ref[:, 0].numpy()).all(), split
    decode, rows = request_rope_positions(n, 3, items, 2)
    assert rows is None and decode.tolist() == [n + int(delta) + k for k in range(3)]
