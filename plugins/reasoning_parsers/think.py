"""``<think>...</think>`` reasoning parsers.

deepseek_r1: the chat template opens ``<think>`` in the prompt, so the output may start inside the
reasoning: everything up to ``</think>`` is reasoning (all of it, if the output never closes it).
qwen3: reasoning only when the output itself opens ``<think>``; otherwise it is all content (thinking
disabled, ``enable_thinking=False``).
"""

from __future__ import annotations

from octavo.parsers import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
    starts_in_reasoning = True


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"
    starts_in_reasoning = False
