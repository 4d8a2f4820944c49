"""Random paged-attention cases and a float64 dense reference, shared by the GPU kernel tests and benchmarks.

A case is a batch of requests, each with ``ctx_len`` positions already in the paged cache and ``q_len`` new
tokens. Physical blocks are drawn at random (block 0 stays the null block) and the whole cache is filled
with random values first, so a kernel that reads a wrong slot or skips a write gets a wrong answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from octavo.attention import AttentionLayout


@dataclass
class PagedCase:
    layout: AttentionLayout
    query: torch.Tensor  # [T, Hq, D]
    key: torch.Tensor  # [T, Hkv, D]  new tokens only
    value: torch.Tensor
    kv_cache: torch.Tensor  # [2, NB, bs, Hkv, D], prefix already written
    k_full: list  # per request [seq_len, Hkv, D] (prefix + new)
    v_full: list
    q_lens: list
    ctx_lens: list


def make_case(seqs, num_heads, num_kv_heads, head_size, block_size, dtype, device, seed=0, spare_blocks=3):
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in seqs]
    blocks_per = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = 1 + sum(blocks_per) + spare_blocks
    perm = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=g).to(dtype)
    max_blocks = max(blocks_per) + 1
    block_tables = torch.zeros(len(seqs), max_blocks, dtype=torch.int32)
    queries, keys, values, slots, k_full, v_full = [], [], [], [], [], []
    for i, ((ctx, q), s) in enumerate(zip(seqs, seq_lens)):
        ids = [perm.pop() for _ in range(blocks_per[i])]
        block_tables[i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        kf = torch.randn(s, num_kv_heads, head_size, generator=g).to(dtype)
        vf = torch.randn(s, num_kv_heads, head_size, generator=g).to(dtype)
        pos = torch.arange(s)
        all_slots = torch.tensor(ids)[pos // block_size] * block_size + pos % block_size
        # cached prefix: already in the cache; the new tokens' slots are for the backend to fill
        kv_cache[0].view(-1, num_kv_heads, head_size)[all_slots[:ctx]] = kf[:ctx]
        kv_cache[1].view(-1, num_kv_heads, head_size)[all_slots[:ctx]] = vf[:ctx]
        slots.extend(all_slots[ctx:].tolist())
        queries.append(torch.randn(q, num_heads, head_size, generator=g).to(dtype))
        keys.append(kf[ctx:])
        values.append(vf[ctx:])
        k_full.append(kf)
        v_full.append(vf)
    q_lens = [q for _, q in seqs]
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    num_decode = 0
    for q in q_lens:
        if q != 1:
            break
        num_decode += 1
    layout = AttentionLayout(
        query_start_loc=qsl, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_computed_tokens=torch.tensor([c for c, _ in seqs], dtype=torch.int32),
        block_tables=block_tables, slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_size=block_size, max_query_len=max(q_lens), max_seq_len=max(seq_lens), num_decode_reqs=num_decode)
    return PagedCase(layout, torch.cat(queries).to(device), torch.cat(keys).to(device),
                     torch.cat(values).to(device), kv_cache.to(device), k_full, v_full, q_lens,
                     [c for c, _ in seqs])


def reference(case: PagedCase, scale, sliding_window=None, soft_cap=None) -> torch.Tensor:
    """float64 dense causal attention of every new token over its request's context."""
    outs = []
    q_all = case.query.double().cpu()
    start = 0
    for kf, vf, q_len, ctx in zip(case.k_full, case.v_full, case.q_lens, case.ctx_lens):
        q = q_all[start : start + q_len]  # [q, Hq, D]
        start += q_len
        k, v = kf.double(), vf.double()  # [s, Hkv, D]
        group = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) * scale
        if soft_cap:
            s = soft_cap * torch.tanh(s / soft_cap)
        qpos = torch.arange(ctx, ctx + q_len)[:, None]
        kpos = torch.arange(k.shape[0])[None, :]
        mask = kpos <= qpos
        if sliding_window:
            mask &= kpos > qpos - sliding_window
        s = s.masked_fill(~mask, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v))
    return torch.cat(outs)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double().cpu()
    return float((out - ref).norm() / ref.norm())
