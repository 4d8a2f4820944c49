"""Built-in speculative-decoding proposers (``octavo_register_speculators``); see ``registry.py``."""
