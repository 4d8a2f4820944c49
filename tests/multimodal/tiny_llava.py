"""A tiny random-weight LLaVA-1.5 checkpoint built with transformers (tiny CLIP vision tower + tiny Llama),
its LlavaProcessor (the reference for placeholder expansion and pixels) and test images."""

from __future__ import annotations

import numpy as np
import torch
import transformers
from PIL import Image

IMAGE_TOKEN = 299
WORDS = [f"w{i}" for i in range(250)]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "USER:": 3, "ASSISTANT:": 4}
    vocab.update({w: 5 + i for i, w in enumerate(WORDS)})
    vocab["<image>"] = IMAGE_TOKEN
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<image>"])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>",
                                                eos_token="</s>")


def build_tiny_llava(path):
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                              image_size=56, patch_size=14, projection_dim=32, initializer_range=0.2)
    text = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=300, max_position_embeddings=256, initializer_range=0.2,
                       bos_token_id=1, eos_token_id=None)  # no eos: both sides run MAX_NEW tokens
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN)
    model = LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(path)
    processor = LlavaProcessor(CLIPImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}),
                               _tokenizer(), patch_size=14, vision_feature_select_strategy="default",
                               image_token="<image>", num_additional_image_tokens=1)
    processor.save_pretrained(path)
    return path, model, processor




def make_image(seed: int, size: tuple[int, int]):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def data_url(img) -> str:
    """``img`` as a PNG ``data:`` URL (what an OpenAI ``image_url`` content part carries inline)."""
    import base64
    import io

    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def two_image_content(imgs) -> list[dict]:
    """The server tests' user message ``w7 <image> w4 <image>`` as OpenAI chat content parts (data: URLs)."""
    return [{"type": "text", "text": "w7 "}, {"type": "image_url", "image_url": {"url": data_url(imgs[0])}},
            {"type": "text", "text": " w4 "}, {"type": "image_url", "image_url": {"url": data_url(imgs[1])}}]
