"""The KV-cache manager: each request's block table, prefix-cache lookups and slot allocation.

    request tokens : [t0 .. t15][t16 .. t31][t32 .. t40]      block_size 16
    block table    : [   b4    ][   b9     ][   b2  ...]      b4, b9 full -> hashed, shareable
    hash chain     : h4 = H(None, t0..t15), h9 = H(h4, t16..t31)

A waiting request first looks up its longest cached prefix of full blocks (always leaving at least one
token to compute, so the step produces logits), then allocates blocks for the tokens it schedules. Full
blocks are registered in the prefix cache as soon as they are scheduled; the attention backends write a
step's K/V before attending, so another request in the same step may already read them.
"""

from __future__ import annotations

from octavo.core.kv_cache.block_pool import BlockPool, KVBlock, hash_block_tokens
from octavo.core.multimodal import block_mm_key
from octavo.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def uniform_sliding_window(model) -> int | None:
    """The sliding window shared by every paged attention layer of ``model``, or None (no window, no
    attention layer, or layers that differ, e.g. Gemma 2/3 mixing global layers in)."""
    from octavo.nn import Attention

    windows = {m.sliding_window for m in model.modules() if isinstance(m, Attention)} if model is not None else set()
    return windows.pop() if len(windows) == 1 else None


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool,
                 sliding_window: int | None = None) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        # every layer attends to at most this many recent positions: older blocks can be released
        self.sliding_window = sliding_window
        self.pool = BlockPool(num_blocks, enable_caching)
        self.req_blocks: dict[str, list[KVBlock]] = {}
        self.req_block_ids: dict[str, list[int]] = {}  # the same, as ids (kept in step for the runner)
        self.req_hashes: dict[str, list[bytes]] = {}  # chain hashes of the request's full blocks so far
        self.req_num_cached: dict[str, int] = {}  # leading blocks _cache_full_blocks has already handled

    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_blocks - 1

    def usage(self) -> float:
        return self.pool.usage()

    def max_tokens_in_cache(self) -> int:
        return self.num_usable_blocks * self.block_size

    def _block_hashes(self, req: Request, num_full_blocks: int) -> list[bytes]:
        """Chain hashes of the first ``num_full_blocks`` blocks of ``req``'s tokens (extended incrementally)."""
        hashes = self.req_hashes.setdefault(req.request_id, [])
        done = len(hashes)
        if done >= num_full_blocks:
            return hashes[:num_full_blocks]
        bs = self.block_size
        lora = req.lora_request  # two adapters never share KV blocks (K/V depend on the adapter)
        base = req.cache_salt if lora is None else (req.cache_salt, lora.lora_int_id, lora.lora_path)
        tokens, mm = req.all_token_ids, req.mm_inputs
        parent = hashes[-1] if hashes else None
        for i in range(done, num_full_blocks):  # (a prompt's ~60 blocks at admission: the loop's own cost matters)
            extra = base
            mm_key = block_mm_key(mm, (i + 1) * bs) if mm else None
            if mm_key:  # an image's hash keys every block from its placeholders on
                extra = (base, mm_key)
            parent = hash_block_tokens(parent, tokens[i * bs:(i + 1) * bs], extra)
            hashes.append(parent)
        return hashes[:num_full_blocks]

    def get_computed_blocks(self, req: Request) -> tuple[list[KVBlock], int]:
        """Longest run of cached full blocks at the start of ``req``'s tokens, and the tokens they cover."""
        if not self.enable_caching or req.sampling_params.prompt_logprobs is not None or req.pooling:
            # prompt logprobs and pooling need the hidden state of every prompt token: compute them all.
            return [], 0
        bs = self.block_size
        max_blocks = (req.num_tokens - 1) // bs
        hits: list[KVBlock] = []
        for i, h in enumerate(self._block_hashes(req, max_blocks)):
            block = self.pool.get_cached_block(h, tuple(req.all_token_ids[i * bs:(i + 1) * bs]))
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * bs

    def allocate_slots(self, req: Request, num_new_tokens: int, new_computed_blocks: list[KVBlock] = ()) -> bool:
        """Make room for ``num_new_tokens`` more tokens of ``req`` (after ``new_computed_blocks``, its prefix
        hits when it is first scheduled). Returns False, changing nothing, if there are not enough free blocks."""
        if not new_computed_blocks and self.sliding_window is None:
            # a running request whose tokens fit the blocks it holds (most decode steps): nothing to allocate.
            # The general path below does the same with more dict and list work (the scheduler calls this for
            # every running request every step)
            blocks = self.req_blocks.get(req.request_id)
            num_tokens = req.num_computed_tokens + num_new_tokens
            if blocks and -(-num_tokens // self.block_size) <= len(blocks):
                self._cache_full_blocks(req, num_tokens)
                return True
        blocks = self.req_blocks.setdefault(req.request_id, [])
        if self.sliding_window is not None and blocks and not new_computed_blocks:
            self.free_out_of_window_blocks(req.request_id, req.num_computed_tokens)
        num_computed = req.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_required = cdiv(num_computed + num_new_tokens, self.block_size)
        num_new_blocks = num_required - len(blocks) - len(new_computed_blocks)
        # hits that sit in the free queue stop being free once touched
        num_hits_free = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks > self.pool.num_free_blocks - num_hits_free:
            if not blocks:
                del self.req_blocks[req.request_id]
            return False
        ids = self.req_block_ids.setdefault(req.request_id, [])
        self.pool.touch(list(new_computed_blocks))
        blocks.extend(new_computed_blocks)
        ids.extend(b.block_id for b in new_computed_blocks)
        if num_new_blocks > 0:
            new = self.pool.allocate(num_new_blocks)
            blocks.extend(new)
            ids.extend(b.block_id for b in new)
        self._cache_full_blocks(req, num_computed + num_new_tokens)
        return True

    def free_out_of_window_blocks(self, request_id: str, num_computed: int) -> int:
        """Release the blocks no query of this request can see again; returns how many were released.

        Queries from position ``num_computed`` on see positions ``> num_computed - sliding_window`` only, so
        blocks wholly before that (keeping one block of margin) go back to the pool and the null block takes
        their place in the block table, which keeps its indexing (backends mask those positions anyway).
        """
        blocks = self.req_blocks.get(request_id)
        if self.sliding_window is None or not blocks:
            return 0
        first_visible = num_computed - self.sliding_window + 1
        num_dead = max(0, first_visible // self.block_size - 1)
        null = self.pool.null_block
        dead = [b for b in blocks[:num_dead] if b is not null]
        if dead:
            blocks[:num_dead] = [null] * num_dead
            ids = self.req_block_ids.get(request_id)
            if ids is not None:
                ids[:num_dead] = [null.block_id] * num_dead  # in place: the runner holds this live list
            self.pool.free(list(reversed(dead)))
        return len(dead)

    def _cache_full_blocks(self, req: Request, num_tokens: int) -> None:
        if not self.enable_caching or req.pooling:
            return
        num_full = min(num_tokens, req.num_tokens) // self.block_size
        start = self.req_num_cached.get(req.request_id, 0)  # blocks before it were seen by an earlier call
        if num_full <= start:  # a decode step that fills no block: O(1), not O(blocks) per request per step
            return
        blocks = self.req_blocks[req.request_id]
        bs = self.block_size
        hashes = self._block_hashes(req, num_full)
        for i in range(start, num_full):
            if blocks[i].block_hash is None and blocks[i] is not self.pool.null_block:  # released (window)
                self.pool.cache_full_block(blocks[i], hashes[i], tuple(req.all_token_ids[i * bs:(i + 1) * bs]))
        self.req_num_cached[req.request_id] = num_full

    def free_tail_blocks(self, req: Request, num_tokens: int) -> None:
        """Release the blocks wholly past ``req``'s first ``num_tokens`` tokens: the slots of rejected
        speculative tokens (never hashed: only full blocks of verified tokens are)."""
        blocks = self.req_blocks.get(req.request_id)
        keep = cdiv(num_tokens, self.block_size)
        if blocks and len(blocks) > keep:
            tail = blocks[keep:]
            del blocks[keep:]
            del self.req_block_ids[req.request_id][keep:]  # in place: the live list the runner was given
            self.pool.free(list(reversed(tail)))
            if self.req_num_cached.get(req.request_id, 0) > keep:
                self.req_num_cached[req.request_id] = keep

    def free(self, req: Request) -> None:
        """Release ``req``'s blocks, last block first (see ``BlockPool.free``)."""
        blocks = self.req_blocks.pop(req.request_id, [])
        self.req_block_ids.pop(req.request_id, None)
        self.pool.free(list(reversed(blocks)))
        self.req_hashes.pop(req.request_id, None)
        self.req_num_cached.pop(req.request_id, None)

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table (a live list: valid for the current step; do not mutate)."""
        return self.req_block_ids.get(request_id, [])
