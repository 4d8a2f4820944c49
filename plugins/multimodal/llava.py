"""LLaVA-1.5's input processor: PIL images -> CLIP pixel tensors, ``<image>`` -> N placeholder tokens.

Why transformers' ``CLIPImageProcessor``: the checkpoint ships its ``preprocessor_config.json`` (resize,
crop, mean/std); reusing the reference implementation keeps pixels bit-identical to transformers. Without
that file the CLIP defaults at the vision config's ``image_size`` are used.

The prompt must hold exactly one image token per image (LLaVA-1.5's "USER: <image>\\n..." format); each is
expanded to ``(image_size / patch_size) ** 2`` tokens (+1 with the "full" strategy, which keeps CLS).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from octavo.plugins.multimodal.preprocessed import Preprocessed


class LlavaImageProcessor:
    modalities = ("image",)
    placeholder_text = "<image>"  # what a chat image part becomes before the chat template renders

    def __init__(self, hf_config: Any, model_path: str | None) -> None:
        from transformers import CLIPImageProcessor

        vcfg = hf_config.vision_config
        self.image_token_id = int(getattr(hf_config, "image_token_id", None) or hf_config.image_token_index)
        per_side = vcfg.image_size // vcfg.patch_size
        full = getattr(hf_config, "vision_feature_select_strategy", "default") == "full"
        self.tokens_per_image = per_side * per_side + (1 if full else 0)
        if model_path and (Path(model_path) / "preprocessor_config.json").is_file():
            self.image_processor = CLIPImageProcessor.from_pretrained(model_path)
        else:
            size = vcfg.image_size
            self.image_processor = CLIPImageProcessor(size={"shortest_edge": size},
                                                      crop_size={"height": size, "width": size})

    def process(self, prompt_ids: list[int], items: dict[str, list[Any]]) -> tuple[list[int], list[dict]]:
        """``(prompt ids, {"image": [PIL images]})`` -> ``(expanded ids, one dict per image)``.

        Each dict: modality, hash (sha256 of the pixel tensor), offset/length of its placeholders, and the
        float32 pixel array. Raises ``ValueError`` naming the problem (wrong count, not an image).
        """
        images = items.get("image", [])
        count = prompt_ids.count(self.image_token_id)
        if count != len(images):
            raise ValueError(f"the prompt has {count} image placeholder token(s) (id {self.image_token_id}, "
                             f"'<image>') but {len(images)} image(s) were given; put one '<image>' per image.")
        pixels = [img.value if isinstance(img, Preprocessed) else self._pixels(img, i) for i, img in enumerate(images)]
        out_ids: list[int] = []
        mm: list[dict] = []
        k = 0
        for t in prompt_ids:
            if t != self.image_token_id:
                out_ids.append(t)
                continue
            px = pixels[k]
            mm.append({"modality": "image", "hash": hashlib.sha256(px.tobytes()).hexdigest(),
                       "offset": len(out_ids), "length": self.tokens_per_image, "array": px})
            out_ids.extend([self.image_token_id] * self.tokens_per_image)
            k += 1
        return out_ids, mm

    def preprocess(self, image: Any, index: int = 0) -> Preprocessed:
        """The pixel work for one image, ahead of :meth:`process` (see plugins/multimodal/preprocessed.py)."""
        return Preprocessed(self._pixels(image, index))

    def _pixels(self, image: Any, index: int) -> np.ndarray:
        from PIL import Image

        if not isinstance(image, Image.Image):
            raise ValueError(f"image {index} is a {type(image).__name__}, not a PIL.Image.Image.")
        try:
            image.load()
            rgb = image.convert("RGB")
            out = self.image_processor(images=rgb, return_tensors="np")["pixel_values"][0]
        except Exception as e:  # noqa: BLE001 - truncated / corrupt files raise OSError, SyntaxError, ...
            raise ValueError(f"image {index} could not be decoded: {type(e).__name__}: {e}") from None
        return np.ascontiguousarray(out, dtype=np.float32)  # [3, H, W]
