"""The ``--ab s6`` variants of benchmarks/fp8_bs1.py: each a name and the settings it changes from the tree's defaults.

Why its own file: the table (and the history of what each variant measured, in the comments) grew with every
session's A/B and outgrew the benchmark's own code; ``main()`` adds the "swept" variants at run time.
"""

# --ab s6, in this order after "default" (the tree's defaults): the settings each variant changes from
# (fp8_fused.SMALL_ROWS_WARPS=16, fp8_prefetch.PREFETCH_MB=0 / PDL=False / SELF_PREFETCH=False, the platform's PDL for
# rotary / SiLU / plain norm as the platform has it: cuda_pdl.set_pdl, fp8_silu_gemv on). norm4 = session 5's
# 4-warp quantizing norm at one row. Session 6 batch 1 (H100): prefetch chain and self-prefetch slower, PDL within noise (docs/performance.md)
S6_VARIANTS = {"nosilu": {"silu": False}, "norm4": {"warps": None}, "pf16": {"mb": 16}, "self": {"self": True},
               "pf16_self": {"mb": 16, "self": True}, "pf16_pdl": {"mb": 16, "pdl": True},
               "pf16_self_pdl": {"mb": 16, "self": True, "pdl": True},
               "pf16_self_pdl_all": {"mb": 16, "self": True, "pdl": True, "pdl_all": True},
               "pf32": {"mb": 32}, "pdl": {"pdl": True, "pdlw": False}, "platform_pdl_off": {"pdl_all": False},
               "default_again": {}, "bits": {"bits": True}, "nobits": {"bits": False, "reg_pf": False},
               "bits_again": {"bits": True}, "regpf": {"reg_pf": True}, "bits_regpf": {"bits": True, "reg_pf": True},
               "acc16": {"acc": 16}, "acc8": {"acc": 8}, "acc16_regpf": {"acc": 16, "reg_pf": True},
               "acc0": {"acc": 0, "bits": False, "reg_pf": False}, "x2d": {"x2d": True},
               "acc0_x2d": {"acc": 0, "bits": False, "reg_pf": False, "x2d": True},
               "one": {"one": {}}, "one_s8": {"one": {"splits": 8}}, "one_w8": {"one": {"num_warps": 8}},
               "one_n32": {"one": {"block_n": 32}}, "one_s32_n32": {"one": {"splits": 32, "block_n": 32}},
               "pdlw": {"pdl": True, "pdlw": True}, "pdlw_again": {"pdl": True, "pdlw": True},
               "nopdl": {"pdl": False, "pdlw": False}, "nopdl_again": {"pdl": False, "pdlw": False},
               "silu": {"silu": True}, "silu_again": {"silu": True}, "rope": {"rope": True},
               "rope_again": {"rope": True}, "silu_rope": {"silu": True, "rope": True},
               "silu_rope_again": {"silu": True, "rope": True}, "unfused": {"silu": False, "rope": False},
               "unfused_again": {"silu": False, "rope": False}, "notable": {"table": False},
               "notable_again": {"table": False}, "default_again2": {},
               "self_again": {"self": True}, "pf32_again": {"mb": 32},
               "pw2": {"pwb": 2}, "pw3": {"pwb": 3}, "pw4": {"pwb": 4}, "pw2_again": {"pwb": 2},
               "pw4_again": {"pwb": 4}, "pw3_again": {"pwb": 3},
               "pw4_o": {"pw_shape": {(4096, 4096): 4}}, "pw4_o_down": {"pw_shape": {(4096, 4096): 4, (4096, 14336): 4}},
               "pw4_qkv_o": {"pw_shape": {(6144, 4096): 4, (4096, 4096): 4}},
               "pw4_noup": {"pwb": 4, "pw_shape": {(28672, 4096): 1}},
               "pw4_qkv16": {"pwb": 4, "table_tiles": {(6144, 4096): (16, 1024, 8, 3)}},
               "pw4_down8": {"pwb": 4, "table_tiles": {(4096, 14336): (8, 1024, 4, 4)}},
               "pw4_o8": {"pwb": 4, "table_tiles": {(4096, 4096): (8, 1024, 4, 4)}},
               "amax1": {"amax": True}, "amax1_again": {"amax": True}, "pw2_amax1": {"pwb": 2, "amax": True},
               "normpdl": {"norm_pdl": True}, "normpdl_again": {"norm_pdl": True},
               "normpdl_amax1": {"norm_pdl": True, "amax": True}, "normpdl_amax1_pw2": {"norm_pdl": True, "amax": True, "pwb": 2},
               "loop2": {"loop2": 2}, "loop2_again": {"loop2": 2}, "loop2_pw4": {"loop2": 2, "pwb": 4},
               "loop4": {"loop2": 4}, "loop4_again": {"loop2": 4}, "loop4_pw4": {"loop2": 4, "pwb": 4},
               "all4": {"loop2": 2, "pwb": 4, "amax": True, "norm_pdl": True},
               "all2": {"loop2": 2, "pwb": 2, "amax": True, "norm_pdl": True},
               "all4_loop4": {"loop2": 4, "pwb": 4, "amax": True, "norm_pdl": True},
               "loop4_od8w8": {"loop2": 4, "table_tiles": {(4096, 4096): (8, 1024, 8, 3), (4096, 14336): (8, 1024, 8, 3)}},
               "loop4_od4w4": {"loop2": 4, "table_tiles": {(4096, 4096): (4, 1024, 4, 3), (4096, 14336): (4, 1024, 4, 3)}},
               "loop4_all8w8": {"loop2": 4, "table_tiles": {sh: (8, 1024, 8, 3) for sh in
                                                            ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))}},
               "s11": {"loop2": 0}, "s11_again": {"loop2": 0}, "s11_again2": {"loop2": 0},
               "od8w8": {"table_tiles": {(4096, 4096): (8, 1024, 8, 3), (4096, 14336): (8, 1024, 8, 3)}},
               "loop2_qkv16": {"table_tiles": {(6144, 4096): (16, 1024, 8, 3)}, "table_loops": {(6144, 4096): 2}},
               "pw4_o_amax1": {"pw_shape": {(4096, 4096): 4}, "amax": True},
               "gnorm": {"gnorm": True}, "gnorm_again": {"gnorm": True}, "gnorm_again2": {"gnorm": True},
               "default_again3": {}, "gnorm_silu": {"gnorm": True, "silu": True}, "gnorm_pw2": {"gnorm": True, "pwb": 2},
               "od_r128": {"table_tiles": {(4096, 4096): (16, 1024, 8, 3, 128), (4096, 14336): (16, 1024, 8, 3, 128)},
                           "table_loops": {(4096, 4096): 0, (4096, 14336): 0}}}
# session 15 (engineer fp815), all the same bits as the default: "nwfN" = the quantizing norm reads its weight first
# (fp8_fused.W_FIRST_AT, OCTAVO_FP8_NORM_WFIRST=N: 1 triggers the next GEMV after its loads are issued, 2 after the sum
# of squares); "nwf1_pdl" with the norm under PDL (its weight read before the wait); "eio" = the one-launch attention
# reads the slot before its PDL wait and q / k / v in one round trip after it (_fp8_kv_decode_bs1.EARLY_IO_ON,
# OCTAVO_FP8_DECODE_ONE_EARLY_IO); "nwf1_eio" both; "reN" = the rotary kernel reads position + cos / sin before its
# PDL wait (cuda_fusions.ROPE_EARLY, OCTAVO_ROPE_EARLY=N; 2 also triggers the attention before the wait); "s15_all" =
# nwf1 + eio + re1, "s15_all_re2" with re2, "s15_all_amax1" with session 12's amax1 (down / o take the absmax
# with every load in flight: down -15 us in s12b2's critical path, same scale). (The "one*" variants above change DEFAULT_LAUNCH, which the 8B shape's
# TABLE entry overrides since session 8: they ran the default launch.)
_NWF, _EIO = "octavo.plugins.quant.fp8_fused:W_FIRST_AT", "octavo.plugins.attention._fp8_kv_decode_bs1:EARLY_IO_ON"
_RE = "octavo.plugins.platforms.cuda_fusions:ROPE_EARLY"
for _tag, _v in {"nwf1": {"set": {_NWF: 1}}, "nwf2": {"set": {_NWF: 2}}, "eio": {"set": {_EIO: True}},
                 "re1": {"set": {_RE: 1}}, "re2": {"set": {_RE: 2}},
                 "s15_all": {"set": {_NWF: 1, _EIO: True, _RE: 1}}, "s15_all_re2": {"set": {_NWF: 1, _EIO: True, _RE: 2}},
                 "s15_all_amax1": {"set": {_NWF: 1, _EIO: True, _RE: 1}, "amax": True},
                 "nwf1_eio": {"set": {_NWF: 1, _EIO: True}}, "nwf2_eio": {"set": {_NWF: 2, _EIO: True}},
                 "nwf1_pdl": {"set": {_NWF: 1}, "norm_pdl": True},
                 "nwf1_eio_pdl": {"set": {_NWF: 1, _EIO: True}, "norm_pdl": True}}.items():
    for _suffix in ("", "_again", "_again2"):
        S6_VARIANTS.setdefault(_tag + _suffix, _v)
S6_VARIANTS.setdefault("default_again4", {})
# s15a (H100): nwf1 -13 us (default since), nwf1_pdl -22, s15_all -18, eio / re1 even (re1: rotary -24 us, the
# attention +21: its own early loads end later than the rotary), nwf2 / re2 +9; s15b: "nwf0" = sessions 6-14's norm
for _tag, _v in {"nwf0": {"set": {_NWF: 0}}, "s15_all_pdl": {"set": {_NWF: 1, _EIO: True, _RE: 1}, "norm_pdl": True},
                 "nwf1_eio_pdl_amax1": {"set": {_NWF: 1, _EIO: True}, "norm_pdl": True, "amax": True}}.items():
    for _suffix in ("", "_again", "_again2"):
        S6_VARIANTS.setdefault(_tag + _suffix, _v)
# "arope" = the rotary inside the one-launch attention (fp8_attn_rope.py, OCTAVO_FP8_ATTN_ROPE: no rotary launch, the
# attention launched as the qkv GEMV's dependent; the same bits), with EARLY_IO ("arope_eio") and the norm under PDL
_AR = {"set": {"octavo.plugins.quant.fp8_attn_rope:ON": True}, "install": "octavo.plugins.quant.fp8_attn_rope:install"}
for _tag, _v in {"arope": _AR, "arope_eio": {**_AR, "set": {**_AR["set"], _EIO: True}},
                 "arope_eio_pdl": {**_AR, "set": {**_AR["set"], _EIO: True}, "norm_pdl": True}}.items():
    for _suffix in ("", "_again", "_again2"):
        S6_VARIANTS.setdefault(_tag + _suffix, _v)
# s15b (H100): arope -14 us, arope_eio -20, arope_eio_pdl -26, amax1 -17 (n=1), nwf0 +13: since then the defaults are
# nwf1 + arope + eio + the norm under PDL + amax1 ("the package"); s15c: "s14" = session 14's defaults, and the
# package without one of its parts
_ARON = "octavo.plugins.quant.fp8_attn_rope:ON"
for _tag, _v in {"s14": {"set": {_NWF: 0, _EIO: False, _ARON: False}, "norm_pdl": False, "amax": False},
                 "pkg_nopdl": {"norm_pdl": False}, "pkg_noamax": {"amax": False},
                 "pkg_noarope": {"set": {_ARON: False}}}.items():
    for _suffix in ("", "_again", "_again2"):
        S6_VARIANTS.setdefault(_tag + _suffix, _v)
# session 15: the attention launch really changed (the TABLE entry replaced): "att_s8" = 8 key splits (64 programs:
# half the SMs stay free for o_proj's first programs), "att_s8_pw4o" with o_proj reading 4 blocks before its wait,
# "att_s32_n32" = 32 splits of 32-key tiles; other sums in the merge, so tokens may differ (1e-2 tests vs float64)
_TAB = "octavo.plugins.attention._fp8_kv_decode_bs1:TABLE"
_att = {"att_s8": {"set": {_TAB: {(4, 128): dict(splits=8, block_n=64, num_warps=4, deq=3)}}},
        "att_s32_n32": {"set": {_TAB: {(4, 128): dict(splits=32, block_n=32, num_warps=4, deq=3)}}}}
_att["att_s8_pw4o"] = {**_att["att_s8"], "pw_shape": {(4096, 4096): 4}}
for _tag, _v in _att.items():
    for _suffix in ("", "_again"):
        S6_VARIANTS.setdefault(_tag + _suffix, _v)
# session 14: "gnorm" = the residual add + RMSNorm + per-token e4m3 after o_proj / down run by that GEMV's last program
# (fp8_gemv_norm.STATE, OCTAVO_FP8_GEMV_NORM: 63 of the forward's 64 quantizing norm launches go; the norm's sum of
# squares in another fp32 order: an element may move a bf16 step, so tokens may differ in principle; session 14, H100:
# forward +35-41 us, tokens equal, docs/performance.md "FP8 session 14"); "gnorm_pw2" with
# two weight blocks read before the PDL wait (qkv / gate_up now start right behind the tail's one program)
# "od_r128" = o / down on the table's 16x1024 8-warp tile capped at 128 registers (sm_90, Triton 3.6: 154 -> 128 with
# an 8-byte spill), one block a trip: two programs an SM, all 256 in one wave
# session 12 batch 2 (default = o and down with two blocks a trip, fp8_gemv_tiles.LOOPS): "s11" = session 11's
# defaults (one block a trip everywhere); "od8w8" = o / down on 8x1024 8 warps (with the table's loop); "loop2_qkv16"
# = qkv on the 16x1024 8-warp tile with two blocks a trip (fp8_gemv_tiles.LOOPS patched as TILES is)
# "loop2" / "loop4" = the GEMV's main loop loads two / four weight blocks a trip (fp8_gemv.LOOP2; the same bits);
# "all2" / "all4" = loop2 + amax1 + normpdl with 2 / 4 blocks before the wait; "all4_loop4" with loop4;
# "loop4_od8w8" / "loop4_od4w4" = loop4 with o and down on 8x1024 8 warps / 4x1024 4 warps (sm_90 SASS, Triton 3.9:
# the table's 16x1024 w8 takes 161 registers, one program an SM, one 16 KB block in flight; 8x1024 w8 with loop4 128,
# two programs of 32 KB; 4x1024 w4 with loop4 128, four of 16 KB); "loop4_all8w8" = every GEMV on 8x1024 w8
# "normpdl" = the quantizing norms launched under PDL too (fp8_fused.NORM_PDL: resident during the GEMV before them,
# waiting in the kernel; the same bits)
# session 12: "amax1" = the GEMVs that quantize their own input (at batch 1: down) take the row's absmax with every
# load in flight at once (fp8_gemv.AMAX_ONE; the same scale, so the same tokens)
# session 12: "pwN" = the GEMV reads its first N weight blocks (1024 columns each) before its PDL wait instead of 1
# (fp8_prefetch.PDL_W_BLOCKS; the same sums in the same order, so the tokens must equal the first measure's);
# "pw4_<shapes>" = 4 blocks only for those weights (fp8_prefetch.PDL_W_BY_SHAPE: qkv 6144x4096, o 4096x4096,
# gate_up 28672x4096, down 4096x14336), 1 for the rest; "pw4_noup" = 4 for all but gate_up; "pw4_<shape><n>" = pw4
# with that weight's tile in fp8_gemv_tiles.TILES replaced for this card (another tile: another fp32 order)
# session 11 batch 2: "notable" = the one-row GEMV's autotuned tiles instead of fp8_gemv_tiles.TILES (the default on
# an H100 since batch 1's sweep); the sweep itself runs with the table off
# session 11: "silu" = gate/up GEMV with SiLU-and-mul in its epilogue (fp8_silu_gemv, now with PDL + the split
# accumulator; wrappers installed when the variant first runs; another tile, so tokens may differ); "rope" = the
# qkv GEMV with the rotary embedding in its epilogue (fp8_rope_gemv, installed the same way)
# session 10: "pdlw" = the GEMV under PDL reads its first weight block before it waits and lets its dependents
# launch after the wait (fp8_prefetch.PDL_W; bit-identical, so its tokens must equal the first measure's); the
# default since session 10, so "nopdl" is the GEMV of before (no PDL, the norm does not trigger early)
# session 8: "one*" = the batch-1 fp8 attention in one launch (KV write + split-KV + merge,
# plugins/attention/_fp8_kv_decode_bs1.py) with _fp8_kv_decode_bs1.DEFAULT_LAUNCH changed as given
# session 7: "bits" = the GEMV's integer weight conversion (fp8_gemv.W_BITS), "regpf" = its register prefetch of
# the next weight block (fp8_gemv.REG_PF): both bit-identical, so their greedy tokens must equal the first
# measure's; "nobits" = both off (the variants start from the tree default); "acc16"/"acc8" = the GEMV's split
# accumulator (fp8_gemv.ACC_SPLIT: half the registers, twice the programs per SM; another fp32 summation order);
# "x2d" = prequantized input read in the weight tile's layout (fp8_gemv.X2D; bit-identical, same tiles)
# session 16 (engineer fp816), all the same bits as the default unless said: "tmaN" = o_proj and down stream their
# weight blocks by TMA through N shared-memory buffers (fp8_gemv_tma.STAGES, OCTAVO_FP8_GEMV_TMA=N; ~75-92 registers
# instead of 155-255); "tmaN_l2" = the same with the first blocks asked of L2 before the wait instead of block 0 into
# registers (fp8_gemv_tma.L2_BLOCKS, OCTAVO_FP8_GEMV_TMA_L2); "_pa" = down takes its absmax from the SiLU kernel's
# pieces (fp8_silu_amax.py, OCTAVO_FP8_GEMV_TMA_AMAX); "norm8" / "norm32" = the quantizing norms at one row on 8 / 32
# warps (16 since session 6); "att_w2" = the attention on 2 warps, "att_s8_n128" = 8 key splits of one 128-key tile
# (every past key of an 8B context <= 1,024 loaded before the PDL wait, half the partials to merge, 64 programs;
# other sums: tokens may differ); "o8w4" = o_proj on 8x1024 4 warps with two blocks a trip (~half the registers of
# the 16x1024 8-warp tile: its programs fit beside the attention's; another sum order). s16a (H100) measured the polling merge of the splits (spin1 / spin2, removed after
# it: +158 / +73 us, spin2's tokens differed) and the TMA variants: tma3 +96, tma3_l2 +599 (its L2 prefetch was asked
# by 16 threads a row, fixed since), norm8 +14 us (docs/performance.md "FP8 session 16"); the TMA GEMV and the SiLU
# absmax pieces were deleted in session 17 (they lost on the H100 and, s17h, on the H200), with their variants
for _tag, _v in {"norm8": {"warps": 8}, "norm32": {"warps": 32},
                 "att_w2": {"set": {_TAB: {(4, 128): dict(splits=16, block_n=64, num_warps=2, deq=3)}}},
                 "att_s8_n128": {"set": {_TAB: {(4, 128): dict(splits=8, block_n=128, num_warps=4, deq=3)}}},
                 "att_s8_n128_norm32": {"set": {_TAB: {(4, 128): dict(splits=8, block_n=128, num_warps=4, deq=3)}},
                                        "warps": 32},
                 "o8w4": {"table_tiles": {(4096, 4096): (8, 1024, 4, 3)}, "table_loops": {(4096, 4096): 2}},
                 "att_s8_n128_o8w4": {"set": {_TAB: {(4, 128): dict(splits=8, block_n=128, num_warps=4, deq=3)}},
                                      "table_tiles": {(4096, 4096): (8, 1024, 4, 3)},
                                      "table_loops": {(4096, 4096): 2}}}.items():
    for _suffix in ("", "_again", "_again2"):
        S6_VARIANTS.setdefault(_tag + _suffix, _v)
# session 17 (engineer fp817, H200): "h100rows" = the one-row GEMV's H100 table rows (fp8_gemv_tiles TILES / LOOPS)
# run on this card (a card without rows of its own runs the autotuner's tiles, one block a trip); "tsweep" (added
# by fp8_bs1.py --table-sweep) = the rows the in-graph table sweep chose for this card
from benchmarks.fp8_bs1_tiles import H100 as _H100  # noqa: E402 (the table's card name)
from benchmarks.fp8_bs1_tiles import rows_variant as _rows_variant  # noqa: E402
from benchmarks.fp8_bs1_tiles import table_rows as _table_rows  # noqa: E402

for _suffix in ("", "_again", "_again2", "_again3"):
    S6_VARIANTS.setdefault("h100rows" + _suffix, _rows_variant(_table_rows(_H100)))
    S6_VARIANTS.setdefault("notable" + _suffix, {"table": False})
# "ewN" = o_proj / down asked for their next N weight blocks right after the PDL wait (session 17's fp8_gemv EARLY_W:
# +34 us on the H200, s17h; deleted); "sd" = SiLU-and-mul inside down_proj's GEMV (session 17's fp8_silu_down.py:
# +210 us on the H200 rows, +26 us on the H100 rows, s17j; deleted)
