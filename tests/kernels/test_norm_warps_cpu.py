"""``OCTAVO_NORM_SMALL_ROWS_WARPS`` (plugins/platforms/cuda_fusions.py): the warps of every RMSNorm launch of <= 4 rows,
plain and fused with the all-reduce (cuda_allreduce_fusion.py takes the same number, so both reduce over the same
layout and stay bitwise equal: the fusion's start check compares them on the GPU). Honored or refused by name."""

import pytest

pytest.importorskip("triton")


@pytest.mark.parametrize("value,want", [("", 0), ("0", 0), ("2", 2), ("4", 4), ("8", 8), ("16", 16)])
def test_env_setting(monkeypatch, value, want):
    from octavo.plugins.platforms import cuda_fusions

    monkeypatch.setenv("OCTAVO_NORM_SMALL_ROWS_WARPS", value)
    assert cuda_fusions._small_rows_norm_warps() == want


@pytest.mark.parametrize("value", ["3", "32", "sixteen", "-4"])
def test_bad_env_is_refused_by_name(monkeypatch, value):
    from octavo.plugins.platforms import cuda_fusions

    monkeypatch.setenv("OCTAVO_NORM_SMALL_ROWS_WARPS", value)
    with pytest.raises(ValueError, match="OCTAVO_NORM_SMALL_ROWS_WARPS"):
        cuda_fusions._small_rows_norm_warps()


def test_norm_warps_rule_and_switch():
    from octavo.plugins.platforms import cuda_fusions as cf

    before = cf._NORM_WARPS["small_rows"]
    try:
        cf.set_small_rows_norm_warps(0)
        assert (cf.norm_warps(1, 4096), cf.norm_warps(1, 8192), cf.norm_warps(64, 4096)) == (4, 8, 4)
        cf.set_small_rows_norm_warps(16)
        assert (cf.norm_warps(1, 4096), cf.norm_warps(4, 8192), cf.norm_warps(5, 4096)) == (16, 16, 4)
        with pytest.raises(ValueError):
            cf.set_small_rows_norm_warps(3)
    finally:
        cf.set_small_rows_norm_warps(before)
