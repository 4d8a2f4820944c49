"""The Triton fused MoE kernel on the CPU: its cases under Triton's interpreter (a child pytest, since
``TRITON_INTERPRET=1`` must be set before any kernel is defined), and the config lookup (plain Python)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from octavo.plugins.platforms import cuda_moe
from tests.utils import run_cases_interpreted

HERE = Path(__file__).parent


def test_kernel_cases_under_triton_interpreter():
    pytest.importorskip("triton")
    run_cases_interpreted(HERE / "moe_interp_cases.py", HERE / "moe_decode_interp_cases.py",
                          HERE / "moe_attn_interp_cases.py", unset=("OCTAVO_MOE_TRITON", "OCTAVO_MOE_DECODE_ATTN"),
                          quiet=False, forbid=("skipped",))


def test_default_config_grows_tiles_with_tokens_per_expert():
    small = cuda_moe.default_config(1, 8, 2)
    large = cuda_moe.default_config(4096, 8, 2)
    assert small["BLOCK_M"] == 16 and large["BLOCK_M"] == 64
    assert cuda_moe.default_config(256, 128, 8)["BLOCK_M"] == 16  # 16 slots per expert: still the GEMV shape
    # batch 1 of Qwen3-30B-A3B: 8 experts x 768 / 64 = 96 programs for w13 -> narrower tiles; w2 (H=2048) keeps 64
    c13, w2 = cuda_moe.pick_config(None, 1, 128, 8, 768, 2048)
    assert c13["BLOCK_N"] == 32 and w2 == {"BLOCK_N": 64}
    assert cuda_moe.pick_config(None, 1, 8, 2, 14336, 4096) == (cuda_moe.default_config(1, 8, 2, 14336),
                                                                 {"BLOCK_N": 32})


def test_config_files_by_shape_device_and_dtype(tmp_path, monkeypatch):
    name = cuda_moe.config_file_name(8, 14336, "NVIDIA H100 80GB HBM3", torch.bfloat16)
    assert name == "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3,dtype=bfloat16.json"
    table = {"1": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256, "w2": {"BLOCK_N": 64}},
             "64": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64}, "_meta": {"tuned_by": "test"}}
    (tmp_path / cuda_moe.config_file_name(8, 96, "Fake GPU", torch.float16)).write_text(json.dumps(table))
    monkeypatch.setenv("OCTAVO_MOE_CONFIG_DIR", str(tmp_path))
    cuda_moe.load_configs.cache_clear()
    try:
        loaded = cuda_moe.load_configs(8, 96, "Fake GPU", torch.float16)
        assert sorted(loaded) == [1, 64]  # the _meta entry is not a token count
        assert cuda_moe.pick_config(loaded, 3, 8, 2) == ({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256},
                                                         {"BLOCK_N": 64})
        assert cuda_moe.pick_config(loaded, 50, 8, 2)[0]["BLOCK_M"] == 32
        assert cuda_moe.pick_config(loaded, 4096, 8, 2)[0] == cuda_moe.default_config(4096, 8, 2)
        assert cuda_moe.load_configs(8, 96, "Fake GPU", torch.bfloat16) is None  # dtype is part of the key
        assert cuda_moe.pick_config(None, 3, 8, 2)[0] == cuda_moe.default_config(3, 8, 2)
    finally:
        cuda_moe.load_configs.cache_clear()


def test_shipped_config_files_parse():
    for path in sorted(cuda_moe.CONFIG_DIR.glob("E=*.json")):
        table = json.loads(path.read_text())
        for m, cfg in table.items():
            if m.isdigit():
                assert {"BLOCK_M", "BLOCK_N", "BLOCK_K"} <= set(cfg), path.name


def test_batch_one_decode_tiles_from_the_file_or_defaults():
    """The two-launch batch-1 path's tiles: the ``"decode"`` entry of the file's M=1 config overrides the
    defaults key by key; an unknown part is refused; the general kernel's lookup ignores the entry."""
    from octavo.plugins.platforms.moe_decode_kernels import default_decode_config

    default = default_decode_config(8, 768, 2048)  # Qwen3-30B-A3B: the best tiles of session 6's H100 search
    assert (default["w13"]["BLOCK_N"], default["w13"]["BLOCK_K"], default["w2"]["BLOCK_N"]) == (16, 256, 4)
    mixtral = default_decode_config(2, 14336, 4096)
    assert (mixtral["w13"]["BLOCK_K"], mixtral["w13"]["num_warps"], mixtral["w2"]["BLOCK_N"]) == (512, 8, 8)
    assert cuda_moe.decode_config(None, 8, 768, 2048) == default
    table = {1: {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256, "decode": {"w2": {"BLOCK_N": 16, "num_warps": 2}}}}
    got = cuda_moe.decode_config(table, 8, 768, 2048)
    assert got["w13"] == default["w13"] and got["w2"] == {**default["w2"], "BLOCK_N": 16, "num_warps": 2}
    assert got["w2"]["BLOCK_K"] == default["w2"]["BLOCK_K"]
    assert cuda_moe.pick_config(table, 1, 128, 8) == ({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256}, None)
    with pytest.raises(ValueError, match="unknown keys"):
        cuda_moe.decode_config({1: {"decode": {"w3": {}}}}, 8, 768, 2048)
