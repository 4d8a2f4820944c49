"""GPU tests: run on a CUDA device; without one they skip, except that ``OCTAVO_TRITON_INTERPRET=1`` runs
the Triton kernel tests on the CPU through Triton's interpreter (slow; small shapes only)."""

import os

import pytest

INTERPRET = os.environ.get("OCTAVO_TRITON_INTERPRET") == "1"
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"  # must be set before any @triton.jit runs
    try:
        import numpy as np
        from triton.runtime import interpreter as _interp

        _orig_patch = _interp._patch_lang_tensor

        def _patch_lang_tensor(tensor, scope):
            # triton 3.6's interpreter turns a loaded scalar (a 1-element array) into an int with int(array),
            # which numpy >= 2.4 refuses; take the element instead.
            _orig_patch(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

        _interp._patch_lang_tensor = _patch_lang_tensor
    except ImportError:
        pass


def cuda_device():
    import torch

    return torch.cuda.is_available()


@pytest.fixture(scope="session")
def device():
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda")
    if INTERPRET:
        pytest.importorskip("triton")
        return torch.device("cpu")
    pytest.skip("needs a CUDA GPU (or OCTAVO_TRITON_INTERPRET=1 with triton installed)")
