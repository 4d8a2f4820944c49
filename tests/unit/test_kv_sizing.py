"""The KV sizing pass's arithmetic (core/profiling.py ``kv_budget_from_profile``) on a pretend device.

The device here keeps a loader's freed temporaries in its allocator cache until ``empty_cache``: the budget must
not count them, must count what the profile run reserves and what lives outside the allocator, and must read the
rank's own device."""

from types import SimpleNamespace

import pytest

import octavo.core.profiling as profiling

GIB = 2 ** 30


class FakeDevice:
    """total 80 GiB; 0.5 GiB outside the allocator; weights 9 GiB; 3 GiB cached free after loading."""

    def __init__(self, has_empty_cache: bool = True) -> None:
        self.total, self.outside, self.allocated, self.cached = 80 * GIB, GIB // 2, 9 * GIB, 3 * GIB
        self.peak = self.allocated + 4 * GIB  # the loader's peak, before any reset
        self.indexes: set[int] = set()
        if has_empty_cache:
            self.empty_cache = self._empty_cache

    def memory_total(self, index: int = 0) -> int:
        self.indexes.add(index)
        return self.total

    def memory_free(self, index: int = 0) -> int:
        self.indexes.add(index)
        return self.total - self.outside - self.allocated - self.cached

    def _empty_cache(self) -> None:
        self.cached = 0

    def reset_peak_memory_stats(self, index: int = 0) -> None:
        self.peak = self.allocated

    def peak_memory_allocated(self, index: int = 0) -> int:
        return self.peak

    def memory_reserved(self, index: int = 0) -> int:
        return self.allocated + self.cached

    def profile(self, _worker) -> None:  # activations of 1.25 GiB, freed into the cache (1.5 GiB reserved)
        self.peak = max(self.peak, self.allocated + GIB + GIB // 4)
        self.cached = max(self.cached, GIB + GIB // 2)


def worker_on(device: FakeDevice, index: int = 1) -> SimpleNamespace:
    return SimpleNamespace(platform=device, device=SimpleNamespace(index=index),
                           settings=SimpleNamespace(cache=SimpleNamespace(gpu_memory_utilization=0.9)))


def test_budget_drops_the_loaders_cached_blocks_and_keeps_the_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = FakeDevice()
    monkeypatch.setattr(profiling, "profile_run", dev.profile)
    budget, info = profiling.kv_budget_from_profile(worker_on(dev))
    used = dev.outside + 9 * GIB + GIB + GIB // 2  # context + weights + what the profile run keeps reserved
    assert budget == int(80 * GIB * 0.9) - used
    assert info["cached_free_released_GiB"] == pytest.approx(3.0)
    assert info["profile_added_GiB"] == pytest.approx(1.5)
    assert info["outside_torch_GiB"] == pytest.approx(0.5)
    assert info["torch_peak_allocated_GiB"] == pytest.approx(10.25)  # reset before the profile: not the loader's
    assert dev.indexes == {1}


def test_without_empty_cache_the_cached_blocks_stay_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = FakeDevice(has_empty_cache=False)
    monkeypatch.setattr(profiling, "profile_run", dev.profile)
    budget, info = profiling.kv_budget_from_profile(worker_on(dev, index=0))
    assert budget == int(80 * GIB * 0.9) - (dev.outside + 9 * GIB + 3 * GIB)  # the old, conservative reading
    assert info["cached_free_released_GiB"] == 0


@pytest.mark.parametrize(("max_num_seqs", "want"), [(8, (150, 3, 150)), (2, (128, 2, 128))])
def test_profile_run_fills_the_token_budget_past_max_model_len(monkeypatch: pytest.MonkeyPatch, max_num_seqs: int,
                                                               want: tuple) -> None:
    """A step packs prompts up to max_num_batched_tokens, so the profile's forward has that many tokens even where
    one request is shorter: 150 tokens at max_model_len 64 are three requests (64 + 64 + 22), unless max_num_seqs
    requests hold fewer (2 x 64). A real tiny engine on the CPU (its platform has no memory profiling: called
    directly)."""
    import json
    import tempfile

    from octavo import LLM
    from octavo.core.model_runner import ModelRunner

    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=32, intermediate_size=64,
               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, vocab_size=256,
               max_position_embeddings=128, torch_dtype="float32")
    seen = []
    forward = ModelRunner.forward

    def spy(self, inputs, *a, **k):
        hidden = forward(self, inputs, *a, **k)
        seen.append((int(inputs.input_ids.numel()), int(inputs.query_start_loc.numel()) - 1, hidden.shape[0]))
        return hidden

    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/config.json", "w") as f:
            json.dump(cfg, f)
        llm = LLM(model=d, load_format="dummy", skip_tokenizer_init=True, device="cpu", max_model_len=64,
                  max_num_batched_tokens=150, max_num_seqs=max_num_seqs, kv_cache_memory_bytes=1 << 20)
        worker = llm.llm_engine.core.executor.driver
        monkeypatch.setattr(ModelRunner, "forward", spy)
        profiling.profile_run(worker)
        llm.llm_engine.shutdown()
    assert seen == [want]


class TempKVDevice(FakeDevice):
    """The profile run also reserved a temporary KV cache of 1 GiB, freed into the allocator's cache at its end."""

    def profile(self, _worker) -> int:
        super().profile(_worker)
        self.cached += GIB
        return GIB


def test_the_profiles_temporary_kv_cache_goes_back_to_the_kv_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = TempKVDevice()
    monkeypatch.setattr(profiling, "profile_run", dev.profile)
    budget, info = profiling.kv_budget_from_profile(worker_on(dev))
    used = dev.outside + 9 * GIB + GIB + GIB // 2  # the activations' reservation stays counted, the temp cache not
    assert budget == int(80 * GIB * 0.9) - used
    assert info["profile_added_GiB"] == pytest.approx(2.5)
    assert info["profile_temp_kv_released_GiB"] == pytest.approx(1.0)
    assert info["outside_torch_GiB"] == pytest.approx(0.5)  # read before the release
    assert dev.cached == 0  # handed back to the device


def test_a_temporary_kv_cache_the_device_does_not_get_back_stays_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = TempKVDevice()
    dev.empty_cache = lambda: None  # e.g. a segment still in use: nothing comes back
    monkeypatch.setattr(profiling, "profile_run", dev.profile)
    budget, info = profiling.kv_budget_from_profile(worker_on(dev))
    assert budget == int(80 * GIB * 0.9) - (dev.outside + 9 * GIB + 3 * GIB + GIB)
    assert info["profile_temp_kv_released_GiB"] == 0
