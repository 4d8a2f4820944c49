"""LLaVA-1.5 end to end against transformers: a tiny random-weight checkpoint built here (tiny CLIP vision
tower + tiny Llama), loaded by octavo, fp32 greedy tokens equal to ``LlavaForConditionalGeneration.generate``
on prompts with 1 and 2 images, batched with a text-only prompt; a chunked prefill that splits an image hits
the encoder cache; the prefix cache shares blocks only between prompts with the same image; bad inputs fail
their own request only."""

from __future__ import annotations

import io

import pytest
import torch

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

MAX_NEW = 8


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tests.multimodal.tiny_llava import build_tiny_llava

    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture(scope="module")
def llm(ckpt):
    from octavo import LLM

    # a 40-token budget: the 2-image prompt (2 x 16 placeholders) is chunked across steps, mid-image
    return LLM(model=str(ckpt[0]), dtype="float32", limit_mm_per_prompt={"image": 2}, max_num_batched_tokens=40,
               enable_chunked_prefill=True, max_num_seqs=4)


def _image(seed: int, size: tuple[int, int]):
    from tests.multimodal.tiny_llava import make_image

    return make_image(seed, size)


PROMPT1 = "USER: <image> w1 w2 w3 ASSISTANT:"
PROMPT2 = "USER: w7 <image> w4 <image> w5 w6 ASSISTANT:"
TEXT = "USER: w9 w10 w11 ASSISTANT:"


def _reference(ckpt, prompt: str, images: list) -> list[int]:
    _, model, processor = ckpt
    inputs = processor(text=prompt, images=images or None, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def _runner(llm):
    return llm.llm_engine.core.executor.driver.runner


def test_greedy_matches_transformers_batched_with_text_only(ckpt, llm):
    from octavo import SamplingParams

    img_a, img_b, img_c = _image(0, (64, 48)), _image(1, (40, 70)), _image(2, (56, 56))
    cases = [(PROMPT1, [img_a]), (TEXT, []), (PROMPT2, [img_b, img_c])]
    prompts = [{"prompt": p, "multi_modal_data": {"image": imgs}} if imgs else p for p, imgs in cases]
    cache = _runner(llm).encoder_cache
    hits0, enc0 = cache.hits, cache.encoded
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for (prompt, imgs), out in zip(cases, outs):
        ref = _reference(ckpt, prompt, imgs)
        assert list(out.outputs[0].token_ids) == ref, (prompt, out.outputs[0].token_ids, ref)
        # the expanded prompt equals transformers' LlavaProcessor expansion
        assert list(out.prompt_token_ids) == ckpt[2](text=prompt, images=imgs or None)["input_ids"][0]
    assert cache.encoded - enc0 == 3  # each image ran through the vision tower exactly once
    assert cache.hits - hits0 >= 1  # the chunked 2-image prompt reused an encoded image in a later step


def test_prefix_cache_keys_include_the_image(llm):
    from octavo import SamplingParams

    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    long = "USER: <image> " + " ".join(f"w{i}" for i in range(20)) + " ASSISTANT:"  # 1 + 16 + 21 tokens: two full blocks
    img, other = _image(5, (60, 60)), _image(6, (60, 60))
    llm.generate({"prompt": long, "multi_modal_data": {"image": img}}, params, use_tqdm=False)
    same = llm.generate({"prompt": long, "multi_modal_data": {"image": img}}, params, use_tqdm=False)[0]
    diff = llm.generate({"prompt": long, "multi_modal_data": {"image": other}}, params, use_tqdm=False)[0]
    assert same.num_cached_tokens >= 16  # same image: its blocks are shared
    assert diff.num_cached_tokens == 0  # same token ids, different image: nothing shared


def test_bad_inputs_fail_their_request_only(llm):
    from octavo import SamplingParams
    from octavo.errors import InputError

    params = SamplingParams(max_tokens=2, temperature=0.0)
    imgs = [_image(i, (30, 30)) for i in range(3)]
    with pytest.raises(InputError, match="limit_mm_per_prompt"):
        llm.generate({"prompt": "USER: <image> <image> <image>", "multi_modal_data": {"image": imgs}}, params)
    corrupt = Image.open(io.BytesIO(_png_bytes()[:60]))
    with pytest.raises(InputError, match="could not be decoded"):
        llm.generate({"prompt": PROMPT1, "multi_modal_data": {"image": corrupt}}, params)
    with pytest.raises(InputError, match="placeholder"):
        llm.generate({"prompt": TEXT, "multi_modal_data": {"image": imgs[0]}}, params)
    with pytest.raises(InputError, match="'audio'"):
        llm.generate({"prompt": TEXT, "multi_modal_data": {"audio": b"x"}}, params)
    # the engine still serves
    assert len(llm.generate(TEXT, params, use_tqdm=False)[0].outputs[0].token_ids) == 2


def _png_bytes() -> bytes:
    buf = io.BytesIO()
    _image(9, (32, 32)).save(buf, format="PNG")
    return buf.getvalue()


TEMPLATE = "{% for m in messages %}{{ m['role'].upper() }}: {{ m['content'] }} {% endfor %}ASSISTANT:"


def test_chat_image_url_data_parts_equal_generate(llm):
    import base64

    from octavo import SamplingParams
    from octavo.errors import InputError

    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    img = _image(11, (50, 40))
    buf = io.BytesIO()
    img.save(buf, format="PNG")  # lossless: the same pixels come back
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": " w1 w2 w3"}]}]
    chat = llm.chat(msgs, params, use_tqdm=False, chat_template=TEMPLATE)[0]
    gen = llm.generate({"prompt": PROMPT1, "multi_modal_data": {"image": img}}, params, use_tqdm=False)[0]
    assert chat.prompt_token_ids == gen.prompt_token_ids
    assert chat.outputs[0].token_ids == gen.outputs[0].token_ids
    remote = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}]
    with pytest.raises(InputError, match="'https' is refused"):
        llm.chat(remote, params, use_tqdm=False, chat_template=TEMPLATE)


def test_text_model_refuses_images(llm):
    from octavo.core.multimodal import MultiModalPreprocessor
    from octavo.errors import InputError

    info = llm.llm_engine.model_info
    text_info = type(info)(**{f: getattr(info, f) for f in info.__struct_fields__})
    text_info.architecture = "LlamaForCausalLM"
    pre = MultiModalPreprocessor(llm.llm_engine.settings, text_info)
    with pytest.raises(InputError, match="LlamaForCausalLM takes no multimodal input"):
        pre.prepare({"prompt": "x", "multi_modal_data": {"image": _image(0, (8, 8))}}, [5])
