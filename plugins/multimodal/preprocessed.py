"""An image a modality processor already turned into model input.

Why: the pixel work (resize, normalize, hash input) takes ~10-20 ms per image. The server decodes image
parts in a worker thread (off its event loop) and calls the processor's ``preprocess`` there too, handing
this wrapper on as the ``multi_modal_data`` item; ``process`` then only expands placeholders, so the event
loop never runs the pixel work. A processor accepts its own wrappers and PIL images alike.
"""

from __future__ import annotations

from typing import Any


class Preprocessed:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value
