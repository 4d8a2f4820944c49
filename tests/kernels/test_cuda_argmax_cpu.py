"""plugins/platforms/cuda_argmax.py (the greedy head graph's argmax) == torch.argmax(dim=-1), through Triton's
interpreter on the CPU: ties (first index), NaN (the first NaN wins), +-inf, -0.0 vs 0.0, all -inf rows, row
lengths that are not a multiple of the block, several chunks per row, bf16 and fp32, a strided row view."""

from tests.utils import run_triton_interpreted

_CODE = """
import torch
from octavo.plugins.platforms.cuda_argmax import argmax_rows

g = torch.Generator().manual_seed(0)
for n_cols in (7, 1024, 5000, 20000):
    rows = [torch.randn(n_cols, generator=g) for _ in range(3)]
    rows.append(torch.randint(-2, 2, (n_cols,), generator=g).float())  # many exact ties
    rows += [torch.zeros(n_cols), torch.full((n_cols,), float("-inf"))]
    x = torch.randn(n_cols, generator=g)
    x[n_cols // 3] = x[n_cols - 1] = float("inf")
    rows.append(x)
    for cols in ([n_cols - 1], [0, n_cols // 2], [n_cols // 2, 1]):
        x = torch.randn(n_cols, generator=g)
        x[cols] = float("nan")
        rows.append(x)
    z = torch.full((n_cols,), -1.0)
    z[n_cols // 2] = -0.0
    z[n_cols - 1] = 0.0
    rows.append(z)
    x = torch.stack(rows)
    for t in (x, x.to(torch.bfloat16), torch.cat([x, x], dim=1)[:, :n_cols]):
        for programs in (1, 264, 10_000):
            got, want = argmax_rows(t, programs), t.float().argmax(dim=-1)
            assert torch.equal(got, want), (n_cols, t.dtype, programs, got, want)
print("ok")
"""


def test_argmax_rows_equals_torch_argmax():
    run_triton_interpreted(_CODE, timeout=600)


def test_argmax_kernels_compile_for_sm90_without_a_gpu():
    """The interpreter runs what the GPU compiler refuses (a plain-int global read in a kernel failed on the device
    in s9 batch 1): compile both kernels for sm_90 ahead of time, no GPU needed."""
    import pytest
    import triton

    from octavo.plugins.platforms import cuda_argmax as m

    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:
        pytest.skip("this Triton has no ahead-of-time compile API")
    target = GPUTarget("cuda", 90, 32)
    sig = {"x_ptr": "*fp32", "stride": "i64", "n_cols": "i32", "chunk": "i32", "n_chunks": "i32", "val_ptr": "*fp32",
           "idx_ptr": "*i32", "BLOCK": "constexpr"}
    triton.compile(ASTSource(fn=m._argmax_partial_kernel, signature=sig, constexprs={"BLOCK": m.BLOCK}), target=target)
    sig = {"val_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*i64", "n_chunks": "i32", "MAX_CHUNKS": "constexpr"}
    triton.compile(ASTSource(fn=m._argmax_final_kernel, signature=sig, constexprs={"MAX_CHUNKS": m.MAX_CHUNKS}),
                   target=target)
