"""A tiny random-weight Qwen2-VL (or Qwen2.5-VL) checkpoint built with transformers (2-layer ViT with 2D rotary and a 2x2 patch
merger + a 2-layer Qwen2 language model with M-RoPE), its ``Qwen2VLProcessor`` (the reference for dynamic
resolution, placeholder expansion and pixels) and a chat template with Qwen2-VL's vision markers."""

from __future__ import annotations

import torch
import transformers

WORDS = [f"w{i}" for i in range(250)]
VISION_START, VISION_END, VIDEO_PAD, IMAGE_PAD = 296, 297, 298, 299
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'].upper() }}: {% if m['content'] is string %}"
                 "{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}"
                 "{% else %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}{% endfor %}{% endif %} "
                 "{% endfor %}ASSISTANT:")


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "USER:": 3, "ASSISTANT:": 4}
    vocab.update({w: 5 + i for i, w in enumerate(WORDS)})
    special = {"<|vision_start|>": VISION_START, "<|vision_end|>": VISION_END, "<|video_pad|>": VIDEO_PAD,
               "<|image_pad|>": IMAGE_PAD}
    vocab.update(special)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(special))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>",
                                                eos_token="</s>")


def build_tiny_qwen2vl(path, version: str = "2"):
    """``version`` "2": Qwen2-VL; "2.5": Qwen2.5-VL (windowed ViT: 56-pixel windows = 2x2 merged patches, so
    the test images span several windows; block 1 of 3 attends over the whole image)."""
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    torch.manual_seed(0)
    if version == "2":
        config_cls, model_cls = Qwen2VLConfig, Qwen2VLForConditionalGeneration
        vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, initializer_range=0.2)
    else:
        config_cls, model_cls = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        vision = dict(depth=3, hidden_size=32, out_hidden_size=64, intermediate_size=48, num_heads=4,
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                      fullatt_block_indexes=[1], initializer_range=0.2)
    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=300, max_position_embeddings=512, initializer_range=0.2,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                bos_token_id=1, eos_token_id=None)  # no eos: both sides run every requested token
    config = config_cls(vision_config=vision, text_config=text, image_token_id=IMAGE_PAD,
                        video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
                        vision_end_token_id=VISION_END)
    model = model_cls(config).eval()
    model.save_pretrained(path)
    # small pixel bounds keep the tiny test fast; sizes still vary per image (dynamic resolution)
    images = Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 16)
    images.save_pretrained(path)
    images = transformers.AutoImageProcessor.from_pretrained(path)  # what octavo's processor loads (as here)
    tokenizer = _tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path, model, Reference(images, tokenizer)


class Reference:
    """What ``Qwen2VLProcessor`` does for images (its constructor needs torchvision for the video processor,
    which is not installed here): pixels and ``image_grid_thw`` from the image processor, each
    ``<|image_pad|>`` repeated ``t*h*w / merge**2`` times, ``mm_token_type_ids`` 1 on image tokens."""

    def __init__(self, images, tokenizer) -> None:
        self.images, self.tokenizer = images, tokenizer

    def __call__(self, text: str, images: list | None = None) -> dict:
        inputs = {}
        if images:
            inputs = dict(self.images(images=images, return_tensors="pt"))
            merge = self.images.merge_size ** 2
            for grid in inputs["image_grid_thw"]:
                text = text.replace("<|image_pad|>", "<|placeholder|>" * int(grid.prod() // merge), 1)
            text = text.replace("<|placeholder|>", "<|image_pad|>")
        ids = self.tokenizer(text, return_tensors="pt")
        inputs.update(ids)
        inputs["mm_token_type_ids"] = (ids["input_ids"] == IMAGE_PAD).int()
        return inputs
