"""The built-in reasoning parsers, registered lazily: ``deepseek_r1`` and ``qwen3``."""

from __future__ import annotations

from octavo import hookimpl


@hookimpl(trylast=True)
def octavo_register_reasoning_parsers(register) -> None:
    register("deepseek_r1", "octavo.plugins.reasoning_parsers.think:DeepSeekR1ReasoningParser")
    register("qwen3", "octavo.plugins.reasoning_parsers.think:Qwen3ReasoningParser")
