"""Qwen2-VL's input processor: PIL images at their own resolution -> packed patches + grid, ``<|image_pad|>``
-> one placeholder per merged 2x2 patch block.

Why transformers' image processor: the checkpoint ships ``preprocessor_config.json`` (min/max pixels, patch
and merge sizes, mean/std); ``AutoImageProcessor`` reproduces transformers' resize (``smart_resize``: each
side a multiple of patch*merge, total pixels within bounds) and patch layout exactly. Dynamic resolution:
an image of ``h x w`` patches becomes ``h*w / merge**2`` placeholders, so two images of different sizes get
different counts; the grid travels with the item (``MultiModalInput.grid_thw``) because the vision tower and
the M-RoPE positions need it.

The prompt holds one ``<|image_pad|>`` per image (the chat template writes
``<|vision_start|><|image_pad|><|vision_end|>`` for an image part).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from octavo.plugins.multimodal.preprocessed import Preprocessed


class Qwen2VLImageProcessor:
    modalities = ("image",)
    placeholder_text = "<|vision_start|><|image_pad|><|vision_end|>"  # a chat image part, before templating

    def __init__(self, hf_config: Any, model_path: str | None) -> None:
        vcfg = hf_config.vision_config
        self.image_token_id = int(hf_config.image_token_id)
        self.merge = int(vcfg.spatial_merge_size)
        if model_path and (Path(model_path) / "preprocessor_config.json").is_file():
            from transformers import AutoImageProcessor

            self.image_processor = AutoImageProcessor.from_pretrained(model_path)
        else:
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

            self.image_processor = Qwen2VLImageProcessorPil(patch_size=vcfg.patch_size, merge_size=self.merge,
                                                            temporal_patch_size=vcfg.temporal_patch_size)
        got = int(getattr(self.image_processor, "merge_size", self.merge))
        if got != self.merge:
            raise ValueError(f"preprocessor_config.json merge_size={got} differs from the model's "
                             f"spatial_merge_size={self.merge}")

    def process(self, prompt_ids: list[int], items: dict[str, list[Any]]) -> tuple[list[int], list[dict]]:
        """``(prompt ids, {"image": [PIL images]})`` -> ``(expanded ids, one dict per image)`` (see
        plugins/multimodal/llava.py; here each dict also has ``grid_thw``)."""
        images = items.get("image", [])
        count = prompt_ids.count(self.image_token_id)
        if count != len(images):
            raise ValueError(f"the prompt has {count} image placeholder token(s) (id {self.image_token_id}, "
                             f"'<|image_pad|>') but {len(images)} image(s) were given; put one "
                             "'<|vision_start|><|image_pad|><|vision_end|>' per image.")
        encoded = [img.value if isinstance(img, Preprocessed) else self._patches(img, i)
                   for i, img in enumerate(images)]
        out_ids: list[int] = []
        mm: list[dict] = []
        k = 0
        for t in prompt_ids:
            if t != self.image_token_id:
                out_ids.append(t)
                continue
            px, grid = encoded[k]
            length = int(np.prod(grid)) // (self.merge * self.merge)
            digest = hashlib.sha256(px.tobytes() + np.asarray(grid, dtype=np.int64).tobytes()).hexdigest()
            mm.append({"modality": "image", "hash": digest, "offset": len(out_ids), "length": length,
                       "array": px, "grid_thw": grid})
            out_ids.extend([self.image_token_id] * length)
            k += 1
        return out_ids, mm

    def preprocess(self, image: Any, index: int = 0) -> Preprocessed:
        """The pixel work for one image, ahead of :meth:`process` (see plugins/multimodal/preprocessed.py)."""
        return Preprocessed(self._patches(image, index))

    def _patches(self, image: Any, index: int) -> tuple[np.ndarray, list[int]]:
        from PIL import Image

        if not isinstance(image, Image.Image):
            raise ValueError(f"image {index} is a {type(image).__name__}, not a PIL.Image.Image.")
        try:
            image.load()
            out = self.image_processor(images=[image.convert("RGB")], return_tensors="np")
        except Exception as e:  # noqa: BLE001 - truncated / corrupt files raise OSError, SyntaxError, ...
            raise ValueError(f"image {index} could not be decoded: {type(e).__name__}: {e}") from None
        grid = [int(v) for v in np.asarray(out["image_grid_thw"])[0]]
        return np.ascontiguousarray(out["pixel_values"], dtype=np.float32), grid  # [patches, C*T*P*P]
