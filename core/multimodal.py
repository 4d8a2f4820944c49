"""Front-end side of multimodal input: ``multi_modal_data`` -> expanded prompt ids + ``MultiModalInput``s.

Why here and not in the runner: the placeholder count decides the prompt length, which the scheduler and
the prefix cache need before anything runs; so the processor (a ``modality_processors`` plugin, by model
architecture) runs once per request in the front end, and the pixels travel as plain bytes in the step
contract (``NewRequestData.mm_inputs``). Every error is an ``InputError`` for that request only.
"""

from __future__ import annotations

from typing import Any

from octavo.errors import InputError
from octavo.step import MultiModalInput

DEFAULT_LIMIT = 1  # items per modality per prompt unless limit_mm_per_prompt says otherwise (as vLLM)


class MultiModalPreprocessor:
    """Built lazily by the front end on the first prompt that carries ``multi_modal_data``."""

    def __init__(self, settings: Any, model_info: Any) -> None:
        from octavo import registry

        self.architecture = model_info.architecture
        self.limits = dict(settings.model.limit_mm_per_prompt)
        self.processor = None
        if self.architecture in registry.names("modality_processors"):
            from transformers import AutoConfig

            path = model_info.model
            cls = registry.resolve("modality_processors", self.architecture)
            self.processor = cls(AutoConfig.from_pretrained(path), path)

    def prepare(self, prompt: dict, ids: list[int]) -> tuple[list[int], list[MultiModalInput]]:
        """The tokenized prompt and its ``multi_modal_data`` -> (expanded ids, the items for the runner)."""
        data = prompt["multi_modal_data"]
        if not isinstance(data, dict):
            raise InputError("multi_modal_data must be a dict like {'image': PIL.Image or [PIL.Image, ...]}.",
                             "multi_modal_data")
        if self.processor is None:
            raise InputError(f"{self.architecture} takes no multimodal input (multi_modal_data keys "
                             f"{sorted(data)}); serve a vision-language model such as LLaVA-1.5.",
                             "multi_modal_data")
        items: dict[str, list] = {}
        for modality, value in data.items():
            if modality not in self.processor.modalities:
                raise InputError(f"{self.architecture} does not take {modality!r} input (it takes "
                                 f"{list(self.processor.modalities)}).", "multi_modal_data")
            values = list(value) if isinstance(value, (list, tuple)) else [value]
            limit = self.limits.get(modality, DEFAULT_LIMIT)
            if len(values) > limit:
                raise InputError(f"{len(values)} {modality} items in one prompt, more than limit_mm_per_prompt "
                                 f"allows ({modality}: {limit}); raise --limit-mm-per-prompt.", "multi_modal_data")
            items[modality] = values
        try:
            new_ids, out = self.processor.process(ids, items)
        except ValueError as e:
            raise InputError(str(e), "multi_modal_data") from None
        return new_ids, [MultiModalInput(d["modality"], d["hash"], d["offset"], d["length"], d["array"].tobytes(),
                                         str(d["array"].dtype), list(d["array"].shape), list(d.get("grid_thw", [])))
                         for d in out]


def block_mm_key(mm_inputs: list[MultiModalInput], block_end: int) -> tuple | None:
    """Prefix-cache key part of the block ending at token ``block_end``: the hashes of the items whose
    placeholders start before it (same token ids, different image -> different blocks)."""
    key = tuple(m.hash for m in mm_inputs if m.offset < block_end)
    return key or None
