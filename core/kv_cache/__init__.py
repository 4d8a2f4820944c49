"""Paged KV-cache bookkeeping: the block pool (blocks, ref counts, LRU free queue, prefix-cache map) and the
manager that gives each request its block table."""
