"""The zero-copy safetensors reader (core/loader/safetensors_mmap.py) returns exactly what safetensors does."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from octavo.core.loader.safetensors_mmap import iter_safetensors, num_tensors


def test_same_tensors_as_safetensors(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(7, 5, generator=g), "b.bf16": torch.randn(3, 9, generator=g).bfloat16(),
               "c.f16": torch.randn(4, generator=g).half(), "d.i64": torch.arange(11), "e.u8": torch.arange(6,
               dtype=torch.uint8).view(2, 3), "f.bool": torch.tensor([True, False]), "g.empty": torch.empty(0, 4),
               "h.scalar": torch.tensor(2.5), "i.fp8": torch.randn(8, generator=g).to(torch.float8_e4m3fn)}
    paths = [str(tmp_path / "model-1.safetensors"), str(tmp_path / "model-2.safetensors")]
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[:5]}, paths[0], metadata={"format": "pt"})
    save_file({k: tensors[k] for k in names[5:]}, paths[1])
    got = dict(iter_safetensors(paths))
    assert num_tensors(paths) == len(tensors) == len(got)
    for path in paths:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                want = f.get_tensor(name)
                assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
                assert torch.equal(got[name].view(torch.uint8) if want.dtype == torch.float8_e4m3fn else got[name],
                                   want.view(torch.uint8) if want.dtype == torch.float8_e4m3fn else want), name
    got["a.weight"].mul_(0)  # private to this process: the file is unchanged
    with safe_open(paths[0], framework="pt") as f:
        assert torch.equal(f.get_tensor("a.weight"), tensors["a.weight"])


def test_truncated_file_is_an_error(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(64, 64)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(ValueError, match="damaged or truncated"):
        list(iter_safetensors([str(path)]))
