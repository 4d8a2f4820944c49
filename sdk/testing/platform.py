"""``PlatformContract``: the pytest suite every platform plugin must pass, built-in or third-party.

Subclass it in your package's tests and set ``platform_cls``; pytest collects the subclass (name it
``Test...``) and runs every check below against your class. Checks that need the device skip, with the
platform's own reason, where ``is_available()`` says it cannot run.

    from octavo.testing import PlatformContract

    class TestMyPlatform(PlatformContract):
        platform_cls = MyPlatform
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from octavo.platform import Availability, Platform, PlatformCapabilities

KNOWN_DTYPES = {"float32", "bfloat16", "float16"}
# relative error each dtype's 64x64 matmul must stay within, against float64 (about 8 ulps of its mantissa)
_MATMUL_RTOL = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


class PlatformContract:
    """Contract tests for an :class:`octavo.Platform` subclass.

    Attributes:
        platform_cls: the class under test (required).
        check_registered: also require that the installed plugins resolve ``platform_cls.name`` to exactly
            this class (turn off for a class you test without installing your package).
        check_compute: run real tensors on the device (off when the vendor module is a test double, as in
            octavo's own tests of ``xpu``, ``tpu``, ``hpu`` and ``neuron``: the skip says so).
    """

    platform_cls: ClassVar[type[Platform]]
    check_registered: ClassVar[bool] = True
    check_compute: ClassVar[bool] = True

    @pytest.fixture
    def platform(self) -> Platform:
        availability = self.platform_cls.is_available()
        if not availability:
            pytest.skip(f"{self.platform_cls.name} is not available here: {availability.reason}")
        return self.platform_cls()

    # ------------------------------------------------------------------ without the device
    def test_declares_name_device_type_and_backend(self):
        cls = self.platform_cls
        assert issubclass(cls, Platform), "platform_cls must subclass octavo.Platform"
        for attr in ("name", "device_type", "distributed_backend"):
            value = getattr(cls, attr, None)
            assert isinstance(value, str) and value, f"{cls.__name__}.{attr} must be a non-empty str"

    def test_is_available_returns_availability_with_reason(self):
        result = self.platform_cls.is_available()
        assert isinstance(result, Availability), "is_available() must return octavo.platform.Availability"
        if not result.available:
            assert result.reason, "an unavailable platform must say why (Availability.reason)"

    def test_constructor_takes_no_arguments(self):
        # `octavo plugins` builds every platform, available or not; this must never fail or touch a device.
        self.platform_cls()

    def test_registered_under_its_name(self):
        if not self.check_registered:
            pytest.skip("check_registered is off")
        from octavo.registry import resolve

        resolved = resolve("platforms", self.platform_cls.name)
        assert resolved is self.platform_cls, (
            f"platform {self.platform_cls.name!r} resolves to {resolved!r}; is your package installed and its "
            "register hook correct? (`octavo plugins` shows who registered it)")

    # ------------------------------------------------------------------ with the device
    def test_device_count_and_name(self, platform):
        count = platform.device_count()
        assert isinstance(count, int) and count >= 1
        name = platform.device_name(0)
        assert isinstance(name, str) and name

    def test_memory_is_consistent(self, platform):
        total, free = platform.memory_total(0), platform.memory_free(0)
        assert isinstance(total, int) and total > 0
        assert isinstance(free, int) and 0 <= free <= total

    def test_supported_dtypes(self, platform):
        dtypes = platform.supported_dtypes()
        assert dtypes and set(dtypes) <= KNOWN_DTYPES, f"dtypes {dtypes} must be a non-empty subset of {KNOWN_DTYPES}"
        assert platform.default_dtype() in dtypes, "default_dtype() must be one of supported_dtypes()"

    def test_capabilities_and_preferences(self, platform):
        assert isinstance(platform.capabilities(), PlatformCapabilities)
        backends = platform.preferred_attention_backends()
        assert isinstance(backends, list) and all(isinstance(b, str) and b for b in backends)
        assert isinstance(self.platform_cls.priority, int), "Platform.priority must be an int"

    def test_set_device_and_synchronize(self, platform):
        platform.set_device(0)
        platform.synchronize()

    def test_computes_in_every_supported_dtype(self, platform):
        if not self.check_compute:
            pytest.skip("check_compute is off (the vendor module is a test double)")
        torch = pytest.importorskip("torch")
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(64, 64, dtype=torch.float64, generator=gen)
        b = torch.randn(64, 64, dtype=torch.float64, generator=gen)
        for name in platform.supported_dtypes():
            dtype = getattr(torch, name)
            a_d, b_d = a.to(dtype), b.to(dtype)  # the reference uses the same rounded inputs
            out = (a_d.to(platform.device_type) @ b_d.to(platform.device_type))
            platform.synchronize()
            ref = a_d.double() @ b_d.double()
            err = ((out.cpu().double() - ref).abs().max() / ref.abs().max()).item()
            assert err < _MATMUL_RTOL[name], f"{name} matmul on {platform.device_type}: relative error {err:.2e}"

    def test_own_kernels_keep_the_cores_contract(self, platform):
        """``make_fused_sampler`` / ``make_grammar_mask_apply`` give ``None`` (the core's torch code runs) or a
        callable that computes what the core's code would: greedy rows exactly ``argmax``, random rows only among
        the logits ``>=`` their threshold; ``-inf`` exactly on the tokens a row's bits disallow, in place."""
        sample, apply = platform.make_fused_sampler(), platform.make_grammar_mask_apply()
        assert sample is None or callable(sample), "make_fused_sampler() must return a callable or None"
        assert apply is None or callable(apply), "make_grammar_mask_apply() must return a callable or None"
        if not self.check_compute or (sample is None and apply is None):
            return
        torch = pytest.importorskip("torch")
        gen = torch.Generator().manual_seed(0)
        vocab, dev = 1000, platform.device_type
        logits = torch.randn(4, vocab, generator=gen)
        if sample is not None:
            temp = torch.tensor([0.0, 0.8, 1.0, 0.0])
            thr = torch.tensor([float("-inf"), float("-inf"), logits[2].topk(5).values[-1].item(), 0.0])
            got = sample(logits.to(dev), temp.to(dev), {}, thr.to(dev)).cpu()
            assert got.shape == (4,) and got[0] == logits[0].argmax() and got[3] == logits[3].argmax()
            assert 0 <= got[1] < vocab and logits[2, got[2]] >= thr[2]
        if apply is not None:
            packed = torch.randint(-2**31, 2**31 - 1, (2, (vocab + 31) // 32), dtype=torch.int32, generator=gen)
            rows = torch.tensor([3, 1], dtype=torch.int32)
            out = apply(logits.to(dev), packed.to(dev), rows.to(dev)).cpu()
            bits = (packed.long()[:, :, None] >> torch.arange(32)) & 1  # [2, words, 32]: bit t % 32 of word t // 32
            want = logits.clone()
            for j, r in enumerate(rows.tolist()):
                want[r][bits[j].reshape(-1)[:vocab] == 0] = float("-inf")
            assert torch.equal(out, want), "the grammar mask apply differs from the bit rule"

    def test_own_greedy_argmax_is_torch_argmax(self, platform):
        """``make_greedy_argmax`` gives ``None`` or exactly ``logits.argmax(dim=-1)``: first index of the largest
        value on ties, a NaN counting as the largest, ``-0.0 == 0.0``, rows of any length."""
        argmax = platform.make_greedy_argmax()
        assert argmax is None or callable(argmax), "make_greedy_argmax() must return a callable or None"
        if not self.check_compute or argmax is None:
            return
        torch = pytest.importorskip("torch")
        gen = torch.Generator().manual_seed(0)
        for vocab in (1, 7, 16, 1000, 49_157):
            x = torch.randn(9, vocab, generator=gen)
            x[1] = 0.0
            x[2, vocab // 2:] = float("nan")
            x[3] = float("-inf")
            if vocab > 5:
                x[4, 3] = x[4, vocab - 1] = x[4].max() + 1  # a tie: the first wins
                x[5, 2], x[5, 4], x[6, vocab - 1] = float("nan"), float("inf"), float("nan")
                x[7, 1], x[7, 5] = float("inf"), float("inf")
                x[8] = 0.0
                x[8, 0], x[8, vocab - 2] = -0.0, 0.0
            got = argmax(x.to(platform.device_type)).cpu()
            assert torch.equal(got, x.argmax(dim=-1)), f"greedy argmax differs from torch's at vocab {vocab}"

    def test_selected_when_named_in_settings(self, platform):
        if not self.check_registered:
            pytest.skip("check_registered is off")
        from octavo.config import OctavoSettings
        from octavo.registry import select_platform

        chosen = select_platform(OctavoSettings.from_kwargs(device=self.platform_cls.name))
        assert type(chosen) is self.platform_cls
