"""The built-in structured-output backends, registered lazily (importing this module imports no grammar
library): ``xgrammar`` (default, EBNF/GBNF grammars) and ``guidance`` (llguidance, Lark grammars)."""

from __future__ import annotations

from octavo import hookimpl


@hookimpl(trylast=True)
def octavo_register_structured_output_backends(register) -> None:
    register("xgrammar", "octavo.plugins.structured_output.xgrammar_backend:XGrammarBackend")
    register("guidance", "octavo.plugins.structured_output.guidance_backend:GuidanceBackend")
