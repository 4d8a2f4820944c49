"""The engine core's side of proposing, without a model: which requests get asked, the batch-size policy,
validation of what a proposer returns, and start-time refusals."""

import pytest

from octavo.config import OctavoSettings
from octavo.core.kv_cache.manager import KVCacheManager
from octavo.core.messages import EngineCoreRequest
from octavo.core.request import Request
from octavo.core.scheduler import Scheduler
from octavo.core.spec_decode import SpeculativeDecoding
from octavo.registry import get_plugin_manager
from octavo.sampling_params import SamplingParams


def setup(n_reqs=2, **spec):
    cfg = {"method": "ngram", "num_speculative_tokens": 3, **spec}
    settings = OctavoSettings.from_kwargs(block_size=4, speculative_config=cfg, enable_prefix_caching=False)
    sched = Scheduler(settings, KVCacheManager(64, 4, False), 128)
    for i in range(n_reqs):
        prompt = [1, 2, 3, 4, 1, 2, 3] if i == 0 else [5, 6, 5, 6, 5]
        sched.add_request(Request(EngineCoreRequest(f"r{i}", prompt, SamplingParams(max_tokens=10), 0.0, 0,
                                                    eos_token_id=0), 10))
    sched.update(sched.schedule(), {f"r{i}": 9 for i in range(n_reqs)})
    spec_dec = SpeculativeDecoding(settings, get_plugin_manager(), platform=None, vocab_size=100,
                                   max_model_len=128)
    return spec_dec, sched


def test_decoding_requests_get_drafts():
    spec, sched = setup()
    spec.propose(sched)
    # r0: [1 2 3 4 1 2 3 9]: suffix 9 never seen; [3, 9]? no -> nothing; r1: [5 6 5 6 5 9] -> nothing either
    assert sched.spec_drafts == {}
    sched.update(sched.schedule(), {"r0": 1, "r1": 5})
    spec.propose(sched)
    # r0 [1 2 3 4 1 2 3 9 1]: the latest earlier [1] is followed by 2 3 9; r1 [5 6 5 6 5 9 5]: by 9 5
    assert sched.spec_drafts == {"r0": [2, 3, 9], "r1": [9, 5]}


def test_large_batches_get_no_drafts():
    spec, sched = setup(disable_by_batch_size=2)
    sched.update(sched.schedule(), {"r0": 1, "r1": 5})
    spec.propose(sched)
    assert sched.spec_drafts == {}


def test_malformed_proposals_are_errors():
    spec, sched = setup()
    sched.update(sched.schedule(), {"r0": 1, "r1": 5})

    class Bad:
        def propose(self, reqs):
            return [[1000], []]  # outside the vocabulary

    spec.proposer = Bad()
    with pytest.raises(RuntimeError, match="ngram.*proposed"):
        spec.propose(sched)
    spec.proposer.propose = lambda reqs: [[1]]  # one list for two requests
    with pytest.raises(RuntimeError, match="one list per request"):
        spec.propose(sched)


@pytest.mark.parametrize("cfg, match", [
    ({"method": "ngramm", "num_speculative_tokens": 2}, "Did you mean 'ngram'"),
])
def test_unknown_or_unimplemented_methods(cfg, match):
    settings = OctavoSettings.from_kwargs(speculative_config=cfg)
    with pytest.raises(Exception, match=match):
        SpeculativeDecoding.resolve(settings, get_plugin_manager())
