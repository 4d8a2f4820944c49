"""Built-in reasoning parsers (``--reasoning-parser NAME``)."""
