"""One torch thread for the quantization tests: on the shared 2-CPU CI machines OpenMP threads that spin
against other processes made a decode step ~10x slower than one thread."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
