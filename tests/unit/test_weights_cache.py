"""The on-disk cache of processed GGUF weights (core/loader/weights_cache.py, issue 18 start-up).

A hit must give the model exactly what a fresh load gives (every parameter and buffer: names, kinds, dtypes,
values, ties, persistence); a stale file (another key), a damaged file (bit flip, truncation) is ignored and
rewritten by a normal load; loading that changes anything but tensors is never cached.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

from octavo.core.loader import weights_cache as wc

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _build(monkeypatch, cache_dir, load=True):
    """``(model, cache key)`` of the embedded model loaded as the engine does (``load=False``: the key only)."""
    from octavo.config import OctavoSettings
    from octavo.core.loader import load_model, resolve_model
    from octavo.core.loader.quant import resolve_quantizer
    from octavo.core.plugin_manager import get_plugin_manager
    from octavo.core.worker import choose_dtype

    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("OCTAVO_DISABLE_PROGRESS", "1")
    settings = OctavoSettings()
    pm = get_plugin_manager()
    platform = pm.select_platform(settings)
    resolved = resolve_model(settings.model)
    dtype = choose_dtype(settings.model.dtype, platform, resolved.hf_config)
    quantizer = resolve_quantizer(settings.model.quantization, resolved, platform, pm)
    model_cls = pm.resolve("models", resolved.architecture)
    key = wc.key_for(resolved, model_cls, dtype, torch.device("cpu"), quantizer)
    if not load:
        return None, key
    model = load_model(resolved, model_cls=model_cls, dtype=dtype, device="cpu", quantizer=quantizer)
    return model, key


def _state(model):
    out = {}
    for name, module in model.named_modules():
        for pname, p in module._parameters.items():
            out[f"{name}.{pname}"] = ("param", p)
        for bname, b in module._buffers.items():
            out[f"{name}.{bname}"] = ("buffer" if bname not in module._non_persistent_buffers_set else "np-buffer", b)
    return out


def _assert_same(a, b):
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for name, (kind, x) in sa.items():
        kind_b, y = sb[name]
        assert kind == kind_b, name
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
            assert isinstance(x, torch.nn.Parameter) == isinstance(y, torch.nn.Parameter), name
    ties = lambda m: sorted(  # noqa: E731 - names that share one tensor object
        sorted(n for n, (_, t) in _state(m).items() if t is obj) for obj in {id(t): t for _, t in _state(m).values()
                                                                            if t is not None}.values())
    assert [g for g in ties(a) if len(g) > 1] == [g for g in ties(b) if len(g) > 1]


@pytest.fixture(scope="module")
def mp():
    with pytest.MonkeyPatch.context() as m:
        yield m


@pytest.fixture(scope="module")
def fresh_and_cached(mp, tmp_path_factory):
    cache = tmp_path_factory.mktemp("octavo-cache")
    fresh, key = _build(mp, cache)  # miss: loads the GGUF and writes the cache
    assert key is not None and os.path.isfile(wc.cache_path(key))
    cached, key2 = _build(mp, cache)
    assert key2 == key
    return fresh, cached, key, cache


def test_hit_gives_exactly_the_fresh_load(fresh_and_cached):
    fresh, cached, key, _ = fresh_and_cached
    _assert_same(fresh, cached)
    # the hit really came from the file: its tensors live in the map, not in memory of their own
    path_size = os.path.getsize(wc.cache_path(key))
    unique = {id(t): t for _, t in _state(cached).values() if t is not None}.values()
    assert sum(t.numel() * t.element_size() for t in unique) <= path_size


def test_damaged_or_truncated_file_is_rebuilt(fresh_and_cached, mp, caplog):
    fresh, _, key, cache = fresh_and_cached
    path = wc.cache_path(key)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # flip one byte in the middle of the data
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0x55]))
    with caplog.at_level(logging.WARNING, logger=wc.logger.name):
        rebuilt, _ = _build(mp, cache)
    assert "CRC-32" in caplog.text
    _assert_same(fresh, rebuilt)
    header, mm, _ = wc._read(path, key)  # rewritten: valid again
    mm.close()
    with open(path, "r+b") as f:  # a truncated file is refused the same way (the load above is what follows)
        f.truncate(size - 4096)
    with pytest.raises(wc.CacheMiss, match="truncated"):
        wc._read(path, key)
    assert not wc.try_restore(_Tiny(), key, "model")


def test_stale_file_is_not_used(fresh_and_cached, mp, tmp_path):
    _, _, key, cache = fresh_and_cached
    # a file written for another key under this key's name (e.g. a copied cache folder): refused
    model = _Tiny()
    assert wc.save(model, "a" * 64, wc.snapshot(model)) is not None
    os.replace(wc.cache_path("a" * 64), wc.cache_path("b" * 64))
    with pytest.raises(wc.CacheMiss, match="another key"):
        wc._read(wc.cache_path("b" * 64), "b" * 64)
    # a changed GGUF is another key: one byte of a copy of the file
    from octavo.core.loader import default_model_path

    copy = tmp_path / "model.gguf"
    src = default_model_path()
    with open(src, "rb") as f, open(copy, "wb") as g:
        g.write(f.read())
    with open(copy, "r+b") as g:
        g.seek(os.path.getsize(copy) - 10)
        g.write(b"\x01")
    assert wc.file_digest(str(copy)) != wc.file_digest(src)
    # and so is a changed kernel switch
    mp.setenv("OCTAVO_SOME_KERNEL_SWITCH", "0")
    try:
        _, key_env = _build(mp, cache, load=False)
    finally:
        mp.delenv("OCTAVO_SOME_KERNEL_SWITCH")
    assert key_env != key


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(8, 4)
        self.head = torch.nn.Linear(4, 8, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("scale", torch.ones(4), persistent=False)
        self.register_parameter("nothing", None)
        self.note = "built"


def test_tiny_round_trip_and_contract(tmp_path, monkeypatch):
    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = _Tiny()
    before = wc.snapshot(model)
    model.register_buffer("packed", torch.arange(6, dtype=torch.int8).reshape(2, 3))  # "processing"
    del model.head.weight
    model.head.register_buffer("q", torch.full((8, 4), 3, dtype=torch.uint8), persistent=False)
    assert wc.save(model, "k" * 64, before) is not None
    fresh = _Tiny()
    wc.restore(fresh, "k" * 64)
    _assert_same(model, fresh)
    assert "weight" not in fresh.head._parameters
    # loading that changes a plain attribute is not cached
    model2 = _Tiny()
    before = wc.snapshot(model2)
    model2.note = "processed"
    assert wc.save(model2, "j" * 64, before) is None
    assert not os.path.exists(wc.cache_path("j" * 64))
