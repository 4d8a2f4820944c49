"""Built-in tool-call parsers (``--tool-call-parser NAME``)."""
