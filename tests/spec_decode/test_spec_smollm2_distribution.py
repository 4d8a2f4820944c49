"""Rejection sampling on SmolLM2's real next-token distributions: the tokens emitted with drafts follow the
target distribution computed in float64 from the same weights (transformers), with temperature and top-k;
20k draws per position detect a 2% shift of the likely token by > 5 sigma.

With top-k 40 every token outside the top 40 has probability 0, so the rows are cut to the 256 tokens with
the largest logits of either position (a superset of both top-40s): the same distributions, 200x cheaper."""

from __future__ import annotations

import pytest
import torch

from octavo.core.input_batch import build_sampling_batch
from octavo.core.rejection_sampler import split_emitted, verify
from octavo.core.spec_decode import expand_for_verification
from octavo.sampling_params import SamplingParams
from tests.spec_decode.test_rejection_sampler import chi_square_p, make_req

N, CHUNK, TEMP, TOP_K = 20_000, 10_000, 0.8, 40


@pytest.fixture(scope="module")
@torch.no_grad()
def logits():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.utils import smollm2_safetensors_dir

    path = smollm2_safetensors_dir("float32")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
    ids = tok("The capital of France is Paris. The capital of Italy is", return_tensors="pt").input_ids
    first = model(ids).logits[0, -1]
    d0 = int(first.argmax())  # draft the most likely token, then a fixed second draft
    ext = torch.cat([ids, torch.tensor([[d0]])], dim=1)
    second = model(ext).logits[0, -1]
    return torch.stack([first, second]), d0


def target(row: torch.Tensor) -> torch.Tensor:
    """The distribution plain sampling draws from (temperature, then top-k), in float64."""
    scaled = row / TEMP
    kth = scaled.topk(TOP_K).values[-1]
    return torch.softmax(scaled.masked_fill(scaled < kth, float("-inf")), -1)


def test_smollm2_distribution_is_preserved(logits):
    rows, d0 = logits
    keep = torch.unique(torch.cat([rows[0].topk(256).indices, rows[1].topk(256).indices]))
    d0 = int((keep == d0).nonzero())
    rows = rows[:, keep]
    V = rows.shape[1]
    p0, p1 = target(rows[0]), target(rows[1])
    d1 = int(p1.argsort(descending=True)[3])  # a plausible but unlikely second draft
    bonus = rows[1]  # the bonus row's logits are irrelevant to the two positions tested
    first, second = torch.zeros(V, dtype=torch.long), torch.zeros(V, dtype=torch.long)
    params = SamplingParams(temperature=TEMP, top_k=TOP_K)
    torch.manual_seed(0)
    for c in range(N // CHUNK):
        reqs = [make_req(f"r{c}-{i}", params) for i in range(CHUNK)]
        drafts = [[d0, d1]] * CHUNK
        b = build_sampling_batch(expand_for_verification(reqs, drafts), V, torch.device("cpu"), {})
        lg = torch.stack([rows[0], rows[1], bonus]).float().repeat(CHUNK, 1)
        out = verify(lg, b, [2] * CHUNK, drafts)
        for _, toks in split_emitted(out.row_tokens.tolist(), out.accepted.tolist(), [2] * CHUNK):
            first[toks[0]] += 1
            if len(toks) > 1:
                second[toks[1]] += 1
    assert chi_square_p(first, p0) > 1e-3
    assert second.sum() > 5000
    assert chi_square_p(second, p1) > 1e-3
