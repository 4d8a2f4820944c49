"""Compile the MoE batch-1 w13 kernel (``_w13_route_kernel``, in-kernel routing) for an sm_90 target without a GPU
and print a hash of its PTX instructions (debug info dropped), so two trees can be compared:

    PYTHONPATH=<triton 3.6 site dir> python benchmarks/ptx_compare.py
    PYTHONPATH=<triton 3.6 site dir> python benchmarks/tree_run.py <other tree> benchmarks/ptx_compare.py

Session 11 used it to check that moving the routing into ``cuda_moe_route._route_store`` (d819d3a) left the compiled
instructions unchanged (the device's Triton is 3.6; ptxas ships with Triton, no GPU needed).
"""

from __future__ import annotations

import hashlib
import inspect

import triton
from triton.backends.compiler import GPUTarget

from octavo.plugins.platforms.moe_decode_kernels import _w13_route_kernel

SIG = dict(x_ptr="*bf16", logits_ptr="*bf16", w13_ptr="*bf16", act_ptr="*bf16", weights_ptr="*fp32", ids_ptr="*i64",
           num_experts="i32", N="i32", K="i32", stride_be="i64", stride_bn="i32", w2_ptr="*i8", w2_bytes="i64",
           w2_piece="i32", pf_ptr="*i8", pf_total="i64", pf_piece="i32", flag_ptr="*i32")
# the Qwen3-30B-A3B batch-1 defaults (routing in the kernel)
CONST = dict(TOP_K=8, K_P=8, E_P=128, RENORMALIZE=True, BLOCK_N=16, BLOCK_K=256, PDL=True, PF_W2=False, EVICT="",
             ROUTE_IN=True, PF_NEXT=False, PIPE=False, RANK=False, RANK_CH=16, PARTIAL=False)


def instructions(ptx: str) -> str:
    """The PTX text up to its DWARF sections, without comments, line markers, blank lines or the ``$L__tmp`` labels
    that only mark inlined-scope boundaries for the debug info (an inlined helper moves them; branch labels stay)."""
    body = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    keep = (ln for ln in body.splitlines() if ln.strip() and not ln.strip().startswith((".loc", ".file", "//", "$L__tmp")))
    return "\n".join(keep)


def main() -> None:
    params = list(inspect.signature(_w13_route_kernel.fn).parameters)
    for flag in (False, True):
        const = {k: v for k, v in {**CONST, "FLAG": flag}.items() if k in params}
        sig = {k: SIG.get(k, "constexpr") for k in params}
        src = triton.compiler.ASTSource(fn=_w13_route_kernel, signature=sig, constexprs=const)
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3))
        text = instructions(kernel.asm["ptx"])
        print(f"_w13_route_kernel FLAG={flag}: {len(text.splitlines())} lines, sha1 {hashlib.sha1(text.encode()).hexdigest()[:12]}")


if __name__ == "__main__":
    main()
