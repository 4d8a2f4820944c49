"""``Platform.prepare_model``: the core builds a typed ``ModelHandle`` from the loaded worker, the platform
returns a ``PreparedModel``, and the core installs its step runner -- or refuses a malformed answer naming the
platform. The platform never receives the worker."""

import types

import pytest
import torch

from octavo.config import OctavoSettings
from octavo.core.platform_setup import prepare_on_platform
from octavo.errors import PluginError
from octavo.platform import ModelHandle, PreparedModel
from octavo.registry import resolve


class Recorder:
    def __init__(self, answer):
        self.answer, self.seen, self.name = answer, [], "recorder"

    def prepare_model(self, handle):
        self.seen.append(handle)
        return self.answer(handle) if callable(self.answer) else self.answer


class Runner:
    def maybe_run(self, inputs):
        return None


def _worker(platform, **settings):
    model = torch.nn.Linear(2, 2)
    return types.SimpleNamespace(
        settings=OctavoSettings.from_kwargs(**settings), platform=platform, model=model,
        device=torch.device("cpu"), dtype=torch.float32, attn_backend_cls=resolve("attention_backends", "torch_sdpa"),
        block_size=16, max_model_len=128, runner=types.SimpleNamespace(graph_runner=None))


def test_platform_gets_a_typed_handle_and_its_runner_is_installed():
    runner = Runner()
    platform = Recorder(lambda h: PreparedModel(step_runner=runner, notes={"compiled": True}))
    worker = _worker(platform, max_num_seqs=7, enforce_eager=True)
    prepared = prepare_on_platform(worker)
    (handle,) = platform.seen
    assert isinstance(handle, ModelHandle) and handle.model is worker.model
    assert (handle.max_num_seqs, handle.enforce_eager, handle.block_size, handle.max_model_len) == (7, True, 16, 128)
    assert handle.attn_backend.name == "torch_sdpa" and handle.max_num_batched_tokens >= 128
    with pytest.raises(AttributeError):  # frozen: the handle is data, not a door into the worker
        handle.block_size = 8
    assert worker.runner.graph_runner is runner and prepared.notes == {"compiled": True}


def test_nothing_to_install():
    worker = _worker(Recorder(None))
    assert prepare_on_platform(worker).step_runner is None and worker.runner.graph_runner is None
    worker = _worker(resolve("platforms", "cpu")())  # the built-in default: nothing
    assert prepare_on_platform(worker).step_runner is None


@pytest.mark.parametrize(("answer", "message"), [
    ({"runner": 1}, "returned dict"),
    (PreparedModel(step_runner=object()), "no maybe_run"),
])
def test_malformed_answers_name_the_platform(answer, message):
    with pytest.raises(PluginError, match=f"platform 'recorder'.*{message}"):
        prepare_on_platform(_worker(Recorder(answer)))
