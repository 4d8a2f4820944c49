"""LoRA: many PEFT adapters served at once on one base model (see docs/lora.md).

``octavo.lora.request.LoRARequest`` names an adapter per request; ``octavo.lora.adapter`` reads and checks PEFT
adapters; ``octavo.lora.ops`` is the batched shrink/expand op; ``octavo.lora.manager`` holds device slots.
"""

from octavo.lora.request import LoRARequest

__all__ = ["LoRARequest"]
