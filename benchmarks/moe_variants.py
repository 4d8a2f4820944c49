"""The same-engine A/B lists of the batch-1 MoE forward (``moe_profile.profile_prefetch``; ``$MOE_PF_SET`` picks one):
each row ``(name, attention settings, w13 config keys, w2 config keys[, norm fusions])``, re-captured in one engine.

One list per GPU batch that ran it (docs/performance.md has each one's results); the newest is ``b13``.
"""

# session 8: L2 prefetch hints (plugins/platforms/moe_prefetch.py), each re-captured in the same engine
PF_ALL = ({"prefetch": 1, "merge": 1}, {"PF_W2": True, "PF_NEXT": True, "EVICT": "evict_first"}, {})
PREFETCH_VARIANTS = [  # likeliest first: the part's time cap may cut the list (each row is printed as it ends)
    ("base", {}, {}, {}),
    ("attn_merge1", {"merge": 1}, {}, {}),  # the attention's merge of the splits unrolled
    ("attn_pf1", {"prefetch": 1}, {}, {}),
    ("w13_pipe", {}, {"PIPE": True}, {}),  # w13's loads one K-block ahead (same bits)
    ("w13_pf_w2_evict_first", {}, {"PF_W2": True, "EVICT": "evict_first"}, {}),
    ("w13_pf_next_evict_first", {}, {"PF_NEXT": True, "EVICT": "evict_first"}, {}),
    ("w2_pf_next1", {}, {}, {"PF_NEXT": 1}),
    ("all_w13_next", *PF_ALL),
    ("all_w2_next", {"prefetch": 1, "merge": 1}, {"PF_W2": True, "EVICT": "evict_first"}, {"PF_NEXT": 1}),
    ("route_launch", {}, {"ROUTE": "launch"}, {}),  # routing as its own launch: what the in-kernel routing costs
    # the post-attention norm + router in one launch (moe_norm_router.py), installed here when the engine did not
    ("norm_router", {}, {}, {}, {"nr": True}),
    ("norm_qkv", {}, {}, {}, {"nr": False, "nq": {}}),  # the input norm + qkv GEMV in one launch (moe_norm_qkv.py)
    ("norm_both_all_w13_next", *PF_ALL, {"nr": True, "nq": {}}),
    ("attn_pf2", {"prefetch": 2}, {}, {}),
    ("w2_pf_next2", {}, {}, {"PF_NEXT": 2}),
    ("w13_pipe_bk512", {}, {"PIPE": True, "BLOCK_K": 512}, {}),
    ("w13_pf_w2", {}, {"PF_W2": True}, {}),
    ("base_again", {}, {}, {}),
]


# session 8 batch 2: the engine starts with batch 1's winners as defaults (unrolled attention merge, norm + router
# fused); the old defaults for the same-engine comparison, then tiles with fewer registers (w2's default 4 x 512 at
# 8 warps needs 208 registers: one program per SM over ~4 waves; cuobjdump of the sm_90 build), rank routing,
# attention splits with the cheaper merge, input norm + qkv with tiles of fewer registers
W2 = lambda bn, bk, nw: {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": nw}  # noqa: E731
B2_VARIANTS = [
    ("defaults", {}, {}, {}),
    ("session7_defaults", {"merge": 0}, {}, {}, {"nr": False}),
    ("w2_2x256_4w", {}, {}, W2(2, 256, 4)),  # 92 registers
    ("w2_2x256_8w", {}, {}, W2(2, 256, 8)),  # 80
    ("w2_1x512_4w", {}, {}, W2(1, 512, 4)),  # 111
    ("w13_rank", {}, {"ROUTE": "rank"}, {}),
    ("attn_splits32", {"splits": 32}, {}, {}),
    ("w2_2x128_4w", {}, {}, W2(2, 128, 4)),  # 80
    ("w13_8x256", {}, {"BLOCK_N": 8}, {}),  # 88 registers, 768 programs
    ("norm_qkv_32x256", {}, {}, {}, {"nq": {"block_n": 32, "block_k": 256}}),
    ("attn_splits8", {"splits": 8}, {}, {}),
    ("norm_qkv_8x1024", {}, {}, {}, {"nq": {"block_n": 8, "block_k": 1024}}),
    ("w13_16x128", {}, {"BLOCK_K": 128}, {}),  # 80 registers
    ("w2_2x256_4w+w13_rank", {}, {"ROUTE": "rank"}, W2(2, 256, 4)),
    ("w2_2x256_4w+w13_8x256_rank", {}, {"BLOCK_N": 8, "ROUTE": "rank"}, W2(2, 256, 4)),
    ("defaults_again", {}, {}, {}),
]
# session 9's rows of the early w2 / one launch (w2 "PRE" / "ONE") went with those switches in session 10; what stays
# of its list is the early o_proj (moe_attention "o_early")
T2 = {"BLOCK_N": 2, "BLOCK_K": 128, "num_warps": 4}  # the shipped H100 w2 tile (an H200 has no config file: 4 x 256)
B9_VARIANTS = [("defaults", {}, {}, {}), ("w2_2x128", {}, {}, T2),
               ("o_early8_4x512", {"o_early": 8, "o_tile": (4, 512, 4)}, {}, {}),
               ("o_early8_8x512_8w", {"o_early": 8, "o_tile": (8, 512, 8)}, {}, {}), ("defaults_again", {}, {}, {})]
MIXTRAL = [("defaults", {}, {}, {}), ("defaults_again", {}, {}, {})]  # no Qwen3 attention: no early GEMVs

# session 10 (H100): the o_proj GEMV loading its weight before its PDL wait is the default now (8 rows x the engine GEMV's
# BLOCK_K, 8 warps, PRE 8: the same bits); "o_off" is session 9's path. The qkv GEMV may do the same (moe_attention
# "q_early"; BLOCK_K None = the engine GEMV's, the same bits), or the input norm + qkv launch with PRE K-blocks
# before its wait at the engine's BLOCK_K (moe_norm_qkv.py "pre"; same bits, GPU test of batch 1).
NQ = lambda bn, pre: {"block_n": bn, "block_k": None, "pre": pre}  # noqa: E731
QE = lambda pre, bn, warps: {"q_early": pre, "q_tile": (bn, None, warps)}  # noqa: E731
B10_VARIANTS = [  # likeliest first: rows past the part's time cap are skipped (moe_profile.profile_prefetch)
    ("defaults", {}, {}, {}),
    ("o_off", {"o_early": 0}, {}, {}),
    ("q_early4_8xE_4w", QE(4, 8, 4), {}, {}),  # 162 registers: 3 programs per SM, 396 of 640 resident
    ("norm_qkv_16xE_pre2", {}, {}, {}, {"nq": NQ(16, 2)}),  # 218 registers
    ("norm_qkv_8xE_pre4", {}, {}, {}, {"nq": NQ(8, 4)}),  # 246
    ("q_early2_16xE_4w", QE(2, 16, 4), {}, {}),  # 166
    ("o_early8_4xE_4w", {"o_early": 8, "o_tile": (4, None, 4)}, {}, {}),  # 167: 3 programs per SM
    ("norm_qkv_32xE_pre1", {}, {}, {}, {"nq": NQ(32, 1)}),
    ("q_early4_8xE_4w+o_off", {**QE(4, 8, 4), "o_early": 0}, {}, {}),
    ("defaults_again", {}, {}, {}),
    ("q_early2_8xE_4w", QE(2, 8, 4), {}, {}),
    # the attention's programs (234 registers at 8 warps) leave no room beside an o_proj program of 8 warps on their
    # 64 SMs: an attention at 4 warps, or o_proj programs of 4 warps holding half of K
    ("attn_4w", {"num_warps": 4}, {}, {}),
    ("o_early4_8xE_4w", {"o_early": 4, "o_tile": (8, None, 4)}, {}, {}),
]
# session 11 (H100): route once (the top-k in the norm + router launch's last program, w13 reads 8 ids:
# OCTAVO_MOE_ROUTE_ONCE), session 10's H200 winners on the H100 (input norm + qkv PRE 2 at 16 rows: one norm launch
# a layer less; o_proj at 4 warps), and w13 K loops that keep more bytes in flight (Triton's num_stages does not
# pipeline these plain loads: the sm_90 PTX has no cp.async at 1, 3 or 4 stages; PIPE issues the next K-block's loads
# before this block's products, at tiles with fewer registers than session 8's 16 x 256 PIPE, which lost at 216).
B11_VARIANTS = [  # likeliest first: rows past the part's time cap are skipped
    ("defaults", {}, {}, {}),
    ("route_once", {}, {}, {}, {"ro": True}),
    ("norm_qkv_16xE_pre2", {}, {}, {}, {"nq": NQ(16, 2)}),
    ("route_once+norm_qkv_16xE_pre2", {}, {}, {}, {"ro": True, "nq": NQ(16, 2)}),
    ("o_early4_8xE_4w", {"o_early": 4, "o_tile": (8, None, 4)}, {}, {}),
    ("w13_pipe_16x128", {}, {"PIPE": True, "BLOCK_K": 128}, {}),  # 128 registers (sm_90 build): 4 programs per SM
    ("w13_pipe_8x256", {}, {"PIPE": True, "BLOCK_N": 8}, {}),  # 121 registers, but 768 programs
    ("route_once+w13_pipe_16x128", {}, {"PIPE": True, "BLOCK_K": 128}, {}, {"ro": True}),
    # w13 as tl.dot tiles (moe_w13_dot.py; not the same bits: rel_diff ~1e-2 expected): 64 registers at 16 x 256
    ("w13_dot_16x256", {}, {"DOT": True, "num_stages": 4}, {}),
    ("route_once+w13_dot_16x512", {}, {"DOT": True, "BLOCK_K": 512, "num_stages": 3}, {}, {"ro": True}),
    ("defaults_again", {}, {}, {}),
    ("route_once_again", {}, {}, {}, {"ro": True}),
    ("o_off", {"o_early": 0}, {}, {}),
    ("w13_16x256_8w", {}, {"num_warps": 8}, {}),  # 80 registers at 256 threads (default 154 at 128)
    ("w13_16x512", {}, {"BLOCK_K": 512}, {}),
]
# session 11 batch 2 (H100): the engine starts with batch 1's winners as defaults (input norm + qkv 16 rows PRE 2 at
# the engine GEMV's BLOCK_K; o_proj PRE 4, 8 rows, 4 warps); session 10's defaults alternating with them; w13 as
# tl.dot tiles (moe_w13_dot.py, not the same bits); tiles around the new defaults
S10 = {"o_early": 8, "o_tile": (8, None, 8)}
B12_VARIANTS = [  # likeliest first: rows past the part's time cap are skipped
    ("defaults", {}, {}, {}),
    ("s10_defaults", S10, {}, {}, {"nq": None}),
    ("w13_dot_16x256", {}, {"DOT": True, "num_stages": 4}, {}),
    ("defaults_again", {}, {}, {}),
    ("s10_defaults_again", S10, {}, {}, {"nq": None}),
    ("w13_route_partial", {}, {"ROUTE": "partial"}, {}),  # slot s: s + 1 max rounds before its first load; same bits
    # the early w2 (moe_w2_early.py, same bits): ids from w13's program 0 through a flag, PRE K-blocks before its wait
    # (110-124 registers at 2 x 128 for PRE 1-4, 177 at 6; the plain w2 80)
    ("w2_early2", {}, {}, {"EARLY": 2}),
    ("w13_dot_16x512", {}, {"DOT": True, "BLOCK_K": 512, "num_stages": 3}, {}),
    ("w2_early1", {}, {}, {"EARLY": 1}),
    ("w13_route_partial+w2_early2", {}, {"ROUTE": "partial"}, {"EARLY": 2}),
    ("norm_qkv_off", {}, {}, {}, {"nq": None}),
    ("o_s10", S10, {}, {}),
    ("w2_early6", {}, {}, {"EARLY": 6}),
    ("norm_qkv_16xE_pre4", {}, {}, {}, {"nq": NQ(16, 4)}),
    ("o_early2_8xE_4w", {"o_early": 2, "o_tile": (8, None, 4)}, {}, {}),
    ("norm_qkv_8xE_pre2", {}, {}, {}, {"nq": NQ(8, 2)}),
    ("o_early6_8xE_4w", {"o_early": 6, "o_tile": (8, None, 4)}, {}, {}),
    ("w13_pipe_16x128", {}, {"PIPE": True, "BLOCK_K": 128}, {}),  # 2.724 vs 2.741 in batch 1, rel_diff 0.007
    ("route_once", {}, {}, {}, {"ro": True}),  # batch 1: 2.793 / 2.791 vs 2.741 / 2.740
]
# batch 2b (one GPU alone, <= 80 s with the engine start): the likeliest rows of b12 only
B12S_VARIANTS = [("defaults", {}, {}, {}), ("w2_early2", {}, {}, {"EARLY": 2}),
                 ("w13_route_partial", {}, {"ROUTE": "partial"}, {}), ("s10_defaults", S10, {}, {}, {"nq": None}),
                 ("defaults_again", {}, {}, {}), ("w2_early2_again", {}, {}, {"EARLY": 2})]
# session 12 batch 1 (H100): session 11's b2b / b2c rows (one GPU alone) had w13's partial routing -0.062 / -0.063 ms and
# the early w2 at PRE 2 -0.055 / -0.025 against the defaults, same bits, never together; session 10's o_proj / no
# norm + qkv +0.024 / -0.030 (noise). Both together, each alone, PRE around 2, and the two s11 defaults under them
P = {"ROUTE": "partial"}
B13_VARIANTS = [  # likeliest first: rows past the part's time cap are skipped
    ("defaults", {}, {}, {}),
    ("partial+early2", {}, P, {"EARLY": 2}),
    ("partial", {}, P, {}),
    ("early2", {}, {}, {"EARLY": 2}),
    ("defaults_again", {}, {}, {}),
    ("partial+early2_again", {}, P, {"EARLY": 2}),
    ("partial+early1", {}, P, {"EARLY": 1}),
    ("partial+early3", {}, P, {"EARLY": 3}),
    ("partial+early2+o_s10", S10, P, {"EARLY": 2}),
    ("partial+early2+norm_qkv_off", {}, P, {"EARLY": 2}, {"nq": None}),
    ("partial+early2+s10", S10, P, {"EARLY": 2}, {"nq": None}),
    ("defaults_again2", {}, {}, {}),
    ("partial+early2_again2", {}, P, {"EARLY": 2}),
    ("partial_again", {}, P, {}),
    # b12 rows never measured on an H100 (batch 2a stopped early), on top of the two
    ("partial+early2+nq_pre4", {}, P, {"EARLY": 2}, {"nq": NQ(16, 4)}),
    ("partial+early2+o_early6", {"o_early": 6, "o_tile": (8, None, 4)}, P, {"EARLY": 2}),
    ("partial+early6", {}, P, {"EARLY": 6}),
]
# the same candidates end to end (moe_engine_ab.engine_variant_ab: (name, w13 keys, w2 keys, pinned staging, head
# graphs), the engine's graphs re-captured when the config changes, ms per token), all of them together last
E2E_ROWS = [("defaults", {}, {}, False, False), ("partial+early2", P, {"EARLY": 2}, False, False),
            ("partial+early2+staging", P, {"EARLY": 2}, True, False),
            ("partial+early2+staging+head", P, {"EARLY": 2}, True, True)]
PREFETCH_SETS = {"b1": PREFETCH_VARIANTS, "b2": B2_VARIANTS,  # $MOE_PF_SET picks the list (moe7.sh prefetch / ab,
                 "b9": B9_VARIANTS, "mix": MIXTRAL, "b10": B10_VARIANTS,  # moe9.sh ab / mixab)
                 "b11": B11_VARIANTS, "b12": B12_VARIANTS, "b12s": B12S_VARIANTS,  # moe9.sh ab11 / ab12 / b2b
                 "b13": B13_VARIANTS}  # moe9.sh ab13
