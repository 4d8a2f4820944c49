"""The built-in tool-call parsers, registered lazily: ``hermes`` (``<tool_call>{json}</tool_call>``),
``llama3_json`` (a bare ``{"name", "parameters"}`` object), ``mistral`` (``[TOOL_CALLS][...]``),
``qwen3_xml`` / ``qwen3_coder`` (``<function=NAME><parameter=P>...``) and ``pythonic`` (``[f(a=1)]``)."""

from __future__ import annotations

from octavo import hookimpl

_M = "octavo.plugins.tool_parsers"


@hookimpl(trylast=True)
def octavo_register_tool_parsers(register) -> None:
    register("hermes", f"{_M}.json_formats:HermesToolParser")
    register("llama3_json", f"{_M}.json_formats:Llama3JsonToolParser")
    register("mistral", f"{_M}.json_formats:MistralToolParser")
    register("qwen3_xml", f"{_M}.qwen3_xml:Qwen3XMLToolParser")
    register("qwen3_coder", f"{_M}.qwen3_xml:Qwen3XMLToolParser")
    register("pythonic", f"{_M}.pythonic:PythonicToolParser")
