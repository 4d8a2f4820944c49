"""The ``cpu_paged`` decode kernel against float64 attention at batch sizes the contract suite does not reach,
its selection on CPU, and its fallback to ``torch_sdpa`` where it does not apply."""

import pytest
import torch

from octavo.plugins.attention import _cpu_paged_kernel as kernel
from octavo.plugins.attention.cpu_paged import CpuPagedAttentionBackend

pytestmark = pytest.mark.skipif(kernel.library() is None, reason=f"no C kernel: {kernel.unavailable_reason()}")


def _reference(q, cache, tables, lens, scale):
    b, nh, d = q.shape
    _, _, bs, kvh, _ = cache.shape
    out = torch.empty(b, nh, d, dtype=torch.float64)
    for i in range(b):
        pos = torch.arange(int(lens[i]))
        slots = tables[i][pos // bs] * bs + pos % bs
        k, v = (cache[j].reshape(-1, kvh, d)[slots].double().repeat_interleave(nh // kvh, 1).transpose(0, 1)
                for j in (0, 1))  # [nh, L, d]
        probs = ((q[i].double()[:, None, :] @ k.transpose(1, 2)) * scale).softmax(-1)
        out[i] = (probs @ v)[:, 0]
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-6)])
@pytest.mark.parametrize("heads,kv_heads,d,bs", [(9, 3, 64, 32), (8, 8, 128, 16), (6, 2, 48, 8)])
def test_decode_kernel_matches_float64(dtype, tol, heads, kv_heads, d, bs):
    """Many requests of different lengths on shuffled blocks: specialised (d 64/128) and generic shapes, blocks
    larger, equal and smaller than the kernel's 16-token tile. bf16 inputs are exact in float64, so the bound
    is float32 rounding for both."""
    g = torch.Generator().manual_seed(heads + d + bs)
    num_blocks, b = 400, 40
    cache = torch.randn(2, num_blocks, bs, kv_heads, d, generator=g).to(dtype)
    lens = torch.randint(1, 5 * bs + 7, (b,), generator=g)
    lens[0], lens[1] = 1, bs  # a one-token context, a context of exactly one block
    nb = int(-(-lens.max() // bs))
    tables = torch.stack([torch.randperm(num_blocks - 1, generator=g)[:nb] + 1 for _ in range(b)])
    q = torch.randn(b, heads, d, generator=g).to(dtype)
    out = kernel.paged_decode(q, cache, tables, lens, d ** -0.5)
    assert out.dtype == torch.float32 and out.shape == (b, heads, d)
    assert (out.double() - _reference(q, cache, tables, lens, d ** -0.5)).abs().max().item() < tol


def test_selection_and_refusals():
    ok = CpuPagedAttentionBackend.supports(device_type="cpu", dtype=torch.bfloat16, head_size=64)
    assert ok
    for kw, word in ((dict(dtype=torch.float16), "dtype"), (dict(sliding_window=128), "sliding window"),
                     (dict(head_size=512), "head_size"), (dict(device_type="cuda"), "CPU")):
        args = dict(device_type="cpu", dtype=torch.float32, head_size=64) | kw
        res = CpuPagedAttentionBackend.supports(**args)
        assert not res and word in res.reason
    from octavo.plugins.platforms.cpu import CpuPlatform
    from octavo.registry import get_plugin_manager

    chosen = get_plugin_manager().select_attention_backend(None, CpuPlatform(), dtype=torch.float32, head_size=64)
    assert chosen.name == "cpu_paged"


def test_no_compiler_means_torch_sdpa(monkeypatch):
    """Without a C compiler the backend says why it is unavailable, so selection falls back to torch_sdpa."""
    monkeypatch.setattr(kernel, "_state", {"lib": None, "why": "no C compiler ('cc' not on PATH; set CC)"})
    res = CpuPagedAttentionBackend.supports(device_type="cpu", dtype=torch.float32, head_size=64)
    assert not res and "no C compiler" in res.reason
    from octavo.plugins.platforms.cpu import CpuPlatform
    from octavo.registry import get_plugin_manager

    chosen = get_plugin_manager().select_attention_backend(None, CpuPlatform(), dtype=torch.float32, head_size=64)
    assert chosen.name == "torch_sdpa"


@pytest.mark.parametrize("march", ["-march=haswell", "-march=x86-64"])
def test_kernel_built_for_older_isas(monkeypatch, march):
    """CI machines may be AVX2-only (or older): the same C source built for AVX2 and for baseline x86-64 gives
    the native build's answers (which the float64 test above checks); run here on a CPU that executes all."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 ISA levels")
    g = torch.Generator().manual_seed(7)
    cache = torch.randn(2, 64, 16, 2, 64, generator=g).bfloat16()
    lens = torch.tensor([1, 16, 17, 90, 200])
    tables = torch.stack([torch.randperm(63, generator=g)[:13] + 1 for _ in range(5)])
    q = torch.randn(5, 6, 64, generator=g).bfloat16()
    native = kernel.paged_decode(q, cache, tables, lens, 0.125)
    flags = [f for f in kernel._FLAGS if not f.startswith(("-march", "-mprefer"))] + [march]
    monkeypatch.setattr(kernel, "_FLAGS", flags)
    monkeypatch.setattr(kernel, "_state", {})
    assert kernel.library() is not None, kernel.unavailable_reason()
    assert (kernel.paged_decode(q, cache, tables, lens, 0.125) - native).abs().max().item() < 1e-6


def test_bf16_dot_path_runs_where_the_cpu_has_it():
    """On an AVX-512 BF16 machine, bfloat16 rows of d 64 take the vdpbf16ps path (the float64 test above then
    checks that path); float32 rows and d 48 never do. Its bfloat16 output is the float32 output rounded."""
    flags = open("/proc/cpuinfo").read().split() if __import__("os").path.exists("/proc/cpuinfo") else []
    g = torch.Generator().manual_seed(3)
    cache = torch.randn(2, 40, 16, 3, 64, generator=g).bfloat16()
    lens = torch.tensor([1, 16, 33, 200, 97])
    tables = torch.stack([torch.randperm(39, generator=g)[:13] + 1 for _ in range(5)])
    q = torch.randn(5, 9, 64, generator=g).bfloat16()
    out32 = kernel.paged_decode(q, cache, tables, lens, 0.125)
    assert kernel.last_call_used_bf16_dot() == ("avx512_bf16" in flags and "avx512f" in flags)
    ar = torch.arange(5)
    out16 = kernel.paged_rows(q, cache, tables, ar, lens, ar, torch.ones(5, dtype=torch.int64), 0.125, torch.bfloat16)
    assert out16.dtype == torch.bfloat16 and torch.equal(out16, out32.to(torch.bfloat16))
    kernel.paged_decode(q.float(), cache, tables, lens, 0.125)
    assert not kernel.last_call_used_bf16_dot()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_write_kv_equals_index_copy(dtype):
    """The C K/V write (strided rows of the fused QKV output) leaves the cache index_copy_ leaves; a slot out of
    range raises and writes nothing; a dtype cast takes index_copy_."""
    g = torch.Generator().manual_seed(5)
    cache, ref = torch.zeros(2, 2, 10, 16, 3, 64, dtype=dtype).unbind(0)
    qkv = torch.randn(37, 9 * 64 + 2 * 3 * 64, generator=g).to(dtype)
    k, v = (qkv[:, 9 * 64 + i * 192: 9 * 64 + (i + 1) * 192].view(37, 3, 64) for i in (0, 1))
    slots = torch.randperm(160, generator=g)[:37]
    kernel.write_kv(k, v, cache, slots)
    ref[0].view(160, 3, 64).index_copy_(0, slots, k)
    ref[1].view(160, 3, 64).index_copy_(0, slots, v)
    assert torch.equal(cache, ref)
    before = cache.clone()
    with pytest.raises(IndexError, match="outside"):
        kernel.write_kv(k, v, cache, torch.cat([slots[:-1], torch.tensor([160])]))
    assert torch.equal(cache, before)
    kernel.write_kv(k.double(), v.double(), cache, slots)  # cast path
    assert torch.equal(cache, ref)
