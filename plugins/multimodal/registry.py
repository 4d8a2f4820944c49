"""Every built-in modality processor, by model architecture (entry point ``multimodal``).

A processor turns a prompt's ``multi_modal_data`` into the model's input tensors and expands each
placeholder token into as many placeholders as the item has embeddings. Lazy ``"module:Class"`` targets:
PIL and the image code load only when a multimodal model is served.
"""

from octavo import hookimpl

_PKG = "octavo.plugins.multimodal"

PROCESSORS = {
    "LlavaForConditionalGeneration": f"{_PKG}.llava:LlavaImageProcessor",
    "Qwen2VLForConditionalGeneration": f"{_PKG}.qwen2_vl:Qwen2VLImageProcessor",
    "Qwen2_5_VLForConditionalGeneration": f"{_PKG}.qwen2_vl:Qwen2VLImageProcessor",  # the same processor
}


@hookimpl(trylast=True)
def octavo_register_modality_processors(register):
    for architecture, target in PROCESSORS.items():
        register(architecture, target)
