"""The block pool: fixed-size KV blocks with reference counts, an LRU free queue and the prefix-cache map.

    free queue (eviction order, least recently freed first)
    head -> [b7 cached h=..] -> [b3] -> [b9 cached] -> ... -> tail   (freed blocks are appended at the tail)

A freed block keeps its hash and contents until it is popped for reuse, so a later request with the same
prefix can take it back out of the queue (``touch``). Block 0 is the null block: never allocated, it pads
block tables. Hashes chain over full blocks: ``hash(parent_hash, token_ids, extra_keys)``, and a lookup
also compares the token ids, so a hash collision can never return wrong K/V.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import msgspec


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None  # set once the block is full and registered in the prefix cache
    token_ids: tuple[int, ...] = field(default=())  # the tokens a hashed block holds (collision check)

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, hashed={self.block_hash is not None})"


def hash_block_tokens(parent_hash: bytes | None, token_ids: tuple[int, ...] | list[int], extra_keys=None) -> bytes:
    """Chain hash of one full block: depends on every token before it through ``parent_hash``."""
    # (msgpack writes a list and a tuple alike, as an array: no copy of the tokens needed)
    payload = msgspec.msgpack.encode((parent_hash or b"", token_ids, extra_keys))
    return hashlib.blake2b(payload, digest_size=16).digest()


class BlockPool:
    """Owns every KV block. Requests hold references; a block with ref_cnt 0 sits in the free queue."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks (1 null + 1 usable), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1  # never freed, never handed out
        # block_id -> block, in eviction order (OrderedDict gives O(1) removal from the middle on touch).
        self.free_queue: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks[1:])
        self.cached: dict[bytes, KVBlock] = {}  # block hash -> block holding it

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def usage(self) -> float:
        """Fraction of usable blocks referenced by some request."""
        usable = self.num_blocks - 1
        return (usable - self.num_free_blocks) / usable

    def get_cached_block(self, block_hash: bytes, token_ids: tuple[int, ...]) -> KVBlock | None:
        block = self.cached.get(block_hash)
        if block is None or block.token_ids != token_ids:  # exact check: a hash collision is a miss
            return None
        return block

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on prefix-cache hits; a hit sitting in the free queue leaves it."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1

    def allocate(self, num: int) -> list[KVBlock]:
        """Pop ``num`` blocks from the head of the free queue (least recently freed first), evicting any
        prefix-cache entry they still hold."""
        if num > self.num_free_blocks:
            raise RuntimeError(f"cannot allocate {num} blocks, only {self.num_free_blocks} free")
        out = []
        for _ in range(num):
            _, block = self.free_queue.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def free(self, blocks: list[KVBlock]) -> None:
        """Drop one reference from each block; blocks reaching 0 join the tail of the free queue.

        Callers pass a request's blocks in reverse order, so its last (least shareable) blocks are
        evicted before its first ones, which other requests are more likely to reuse.
        """
        for block in blocks:
            if block is self.null_block:
                continue
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"double free of {block}"
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = block

    def cache_full_block(self, block: KVBlock, block_hash: bytes, token_ids: tuple[int, ...]) -> None:
        """Register a block that just became full. If an identical block is already cached, keep that one
        as the cache entry (this block stays private to its request and is simply freed later)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash = block_hash
        block.token_ids = token_ids
        self.cached.setdefault(block_hash, block)

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None
            block.token_ids = ()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash (only when no request holds a block, as in vLLM)."""
        if self.num_free_blocks != self.num_blocks - 1:
            return False
        for block in self.blocks[1:]:
            self._evict(block)
        return True
