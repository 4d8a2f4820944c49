"""The batch-1 GEMVs' K-blocks before the PDL wait (plugins/platforms/cuda_gemv_pre.py): the setting is honored or
refused by name, and the launchers never ask for more blocks than K has (an EVEN kernel reads unmasked). The sums
are checked under the interpreter in pdl_cases.py / mlp_fusion_cases.py and in test_gemv_push.py (pushing GEMV)."""

import pytest

pytest.importorskip("triton")


@pytest.mark.parametrize("value,want", [("", 1), ("1", 1), ("2", 2), ("4", 4)])
def test_env_setting(monkeypatch, value, want):
    from octavo.plugins.platforms import cuda_gemv_pre

    monkeypatch.setenv("OCTAVO_GEMV_PRE_BLOCKS", value)
    assert cuda_gemv_pre._from_env() == want


@pytest.mark.parametrize("value", ["0", "5", "two", "1.5"])
def test_bad_env_is_refused_by_name(monkeypatch, value):
    from octavo.plugins.platforms import cuda_gemv_pre

    monkeypatch.setenv("OCTAVO_GEMV_PRE_BLOCKS", value)
    with pytest.raises(ValueError, match="OCTAVO_GEMV_PRE_BLOCKS"):
        cuda_gemv_pre._from_env()


def test_pre_blocks_capped_by_k():
    from octavo.plugins.platforms import cuda_gemv_pre

    try:
        cuda_gemv_pre.set_pre_blocks(4)
        assert cuda_gemv_pre.pre_blocks(4096, 512) == 4
        assert cuda_gemv_pre.pre_blocks(2048, 1024) == 2  # o_proj at TP=2 with 1024-wide blocks
        assert cuda_gemv_pre.pre_blocks(100, 512) == 1
        with pytest.raises(ValueError):
            cuda_gemv_pre.set_pre_blocks(0)
        with pytest.raises(ValueError):
            cuda_gemv_pre.set_pre_blocks(True)
    finally:
        cuda_gemv_pre.set_pre_blocks(1)
