"""GPU greedy parity with transformers (see ``parity.py``): Llama (and Qwen3 when registered), bf16, with
the triton backend through CUDA graphs, eagerly, and with the reference backend."""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def test_greedy_parity_with_transformers(tmp_path):
    from tests.gpu.parity import run_parity

    report = run_parity(str(tmp_path))
    for name, res in report.items():
        assert res["agreed_tokens"] > 100, f"{name}: too few tokens compared ({res})"
        if "graphs" in name:
            assert res["graph_replays"] > 0, f"{name}: decode steps did not replay CUDA graphs"
