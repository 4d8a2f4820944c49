"""The chained fill (session 16, core/grammar_chain.py): step N+1's accept of N's tokens, fill and open queued by the
runner as one C job (on CUDA a host function after N's copy event; on a CPU engine run at the launch). Greedy tokens
equal the serial path's; the job really ran on the steady steps; a refused token is warned; a failed call opens the
word on all-ones rows and fails the step by name; the core thread taking a step first means no job runs; the GPU test
checks that the driver ran the host function after the event and the device waited for its word."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

import octavo.plugins.structured_output.xgrammar_native as xn
from octavo.core import grammar_chain, grammar_device_gate, structured_output
from octavo.core.async_gate import GatedGrammarStep
from octavo.core.grammar_chain import Chain
from octavo.core.grammar_device_gate import DeviceGate
from tests.structured.test_grammar_step import VOCAB, schedule
from tests.structured.test_native_start import COMPLETE, LIVE, OPEN, _allowed, _python_reference, _tokens

pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def mgr(tmp_path_factory):
    """The structured-output manager of test_grammar_step.py's ``mgr``, on the embedded model's tokenizer or, where that
    package is not installed (the GPU hosts), on the same SmolLM2 tokenizer the device scripts ship
    (benchmarks/device/smollm2_tokenizer.json.xz), so the GPU test runs there."""
    import json
    import lzma
    from pathlib import Path

    from octavo.config import OctavoSettings
    from octavo.core.loader import load_tokenizer
    from octavo.core.loader.resolve import default_model_path
    from octavo.core.structured_output import StructuredOutputManager

    try:
        default_model_path()
        settings = OctavoSettings.from_kwargs()
    except ValueError:
        d = tmp_path_factory.mktemp("smollm2_tokenizer")
        xz = Path(__file__).resolve().parents[2] / "benchmarks" / "device" / "smollm2_tokenizer.json.xz"
        (d / "tokenizer.json").write_bytes(lzma.open(xz).read())
        (d / "tokenizer_config.json").write_text(json.dumps({
            "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
            "unk_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"}))
        (d / "config.json").write_text(json.dumps({  # (a model directory needs one; no weights are read)
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 2048, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}))
        settings = OctavoSettings.from_kwargs(model=str(d))
    tok = load_tokenizer(settings.model)
    m = StructuredOutputManager(settings, VOCAB, [tok.eos_token_id])
    m.tok = tok
    yield m
    m.shutdown()


def _engine_run(monkeypatch, modes, pool=1):
    from octavo.core.async_engine import set_async_scheduling
    from octavo.executor import Executor
    from tests.structured.test_device_gate import _HostWait, parity_engine, parity_rows

    llm, params, prompts = parity_engine()
    core = llm.llm_engine.core
    ex_cls = type(core.executor)
    overlapped = ex_cls.execute_structured
    kernel = _HostWait()
    out, chained = {}, {}
    yields = {}  # time.sleep(0) calls of the manager after a release, per mode (YIELD_WHEN_CHAINED)

    def run(mode: str):
        set_async_scheduling(core, mode != "serial")
        with monkeypatch.context() as m:
            m.setattr(ex_cls, "execute_structured", Executor.execute_structured if mode == "serial" else overlapped)
            if mode != "serial":
                m.setattr(grammar_device_gate, "DEVICE_GATE", True)
                m.setattr(grammar_device_gate, "NATIVE_OPEN", True)
                m.setattr(grammar_chain, "CHAIN", mode.startswith("chain"))
                m.setattr(structured_output, "YIELD_WHEN_CHAINED", mode != "chain_noyield")
                sleep = structured_output.time.sleep
                m.setattr(structured_output, "time", SimpleNamespace(
                    perf_counter=structured_output.time.perf_counter,
                    sleep=lambda s: (yields.__setitem__(mode, yields.get(mode, 0) + 1), sleep(s))))
                m.setattr(xn, "POOL_THREADS", pool)
                m.setattr(xn, "MIN_ROWS_PER_CHUNK", 1)
                m.setattr(core.executor.driver.runner, "grammar_apply", kernel)
                m.setitem(core.structured._cpu_hint, "device_wait", True)
            core.structured.stats["chained"] = 0
            rows = parity_rows(llm.generate(prompts, params, use_tqdm=False))
            chained[mode] = core.structured.stats["chained"]
            return rows

    try:
        for mode in modes:
            out[mode] = run(mode)
    finally:
        set_async_scheduling(core, False)
        llm.llm_engine.shutdown()
    assert core.structured._device_gate.words[1] == 0  # never gave up
    return out, chained, params, yields


@pytest.mark.parametrize("pool", [1, 3])
def test_chained_tokens_identical_to_serial(monkeypatch, pool):
    jsonschema = pytest.importorskip("jsonschema")
    from tests.structured.test_device_gate import assert_finished_rows_match_schema

    out, chained, params, yields = _engine_run(monkeypatch, ["serial", "chain", "native", "chain_noyield"], pool)
    assert [s[:2] for s in out["serial"]] == [c[:2] for c in out["chain"]] == [n[:2] for n in out["native"]] \
        == [c[:2] for c in out["chain_noyield"]]
    print("chained steps", chained, "yields", yields)
    assert chained["chain"] > 4 and chained["native"] == 0 and chained["chain_noyield"] > 4  # the job took them
    assert yields.get("chain_noyield", 0) < yields["chain"]  # (session 17: no yield after a chained step's release)
    assert_finished_rows_match_schema(out["serial"], params, jsonschema)


def _chained_step(mgr, prefixes, bitmask=None):  # noqa: F811
    """A prepared step of ``prefixes`` with a chained job the runner owns (as core/async_gate.py gives it)."""
    out, _ = schedule(mgr, prefixes)
    step = mgr.prepare(out)
    step.device_gate, step.seq = DeviceGate(pin=False), 7
    job = mgr._get_backend().chain_job(step.matchers, step.bitmask if bitmask is None else bitmask)
    assert job is not None
    step.chain = Chain(job, frozenset())
    assert step.chain.claim("runner")
    return out, step, job


@pytest.mark.parametrize("pool", [1, 4])
@pytest.mark.parametrize("permuted", [False, True])
def test_the_job_accepts_fills_and_opens_as_python_does(mgr, monkeypatch, caplog, pool, permuted):  # noqa: F811
    monkeypatch.setattr(xn, "POOL_THREADS", pool)
    ref, tokens, ok = _python_reference(mgr, _tokens(set(mgr.tok.all_special_ids), refuse=1))
    assert ok.count(False) == 1
    _, step, job = _chained_step(mgr, OPEN)
    step.bitmask.fill_(0)
    n = len(tokens)
    # N's sampled ids as the runner copies them (int64), in N's sample order; index: each row's place in it
    order = list(reversed(range(n))) if permuted else list(range(n))
    sampled = torch.tensor([tokens[order.index(k)] for k in range(n)] if permuted else tokens, dtype=torch.int64)
    job.bind(sampled, [order.index(r) for r in range(n)] if permuted else None, step.device_gate.words, step.seq)
    job.run_now()
    assert job.state() == 1 and step.device_gate.words.tolist() == [7, 0]  # filled, opened by C
    assert torch.equal(step.bitmask, ref)
    backend = mgr._get_backend()
    for name in ("fill_open", "fill_bitmasks"):  # (nothing may fill these rows again)
        monkeypatch.setattr(backend, name, lambda *a, **k: pytest.fail("filled again"))
    with caplog.at_level(logging.WARNING):
        rows = step.wait()  # (settles the job; a wait() before any start() takes the job's rows, fills nothing)
    monkeypatch.undo()
    assert rows[2] is step.bitmask and torch.equal(step.bitmask, ref)
    assert f"request {step.request_ids[1]}: token {tokens[1]} breaks its grammar" in caplog.text
    assert step._error is None and not job.busy  # (the slot is free again)
    step.bitmask.fill_(0)
    mgr._get_backend().fill_bitmasks(step.matchers, step.bitmask)  # the matchers moved as Python's accept moves them
    assert torch.equal(step.bitmask, ref)
    mgr._inflight = None


def test_a_row_that_terminates_is_left_to_the_host_which_fills_and_opens(mgr, monkeypatch):  # noqa: F811
    monkeypatch.setattr(xn, "POOL_THREADS", 4)
    eos = mgr.tok.convert_tokens_to_ids("<|im_end|>")
    out, step, job = _chained_step(mgr, LIVE)
    ref_step = mgr.prepare(schedule(mgr, LIVE)[0])
    ref_step.chunks = None
    before = ref_step.wait()[2].clone()
    done = [j for j, p in enumerate(LIVE) if p == COMPLETE]
    tokens = [eos if j in done else _allowed(before[j], {eos}) for j in range(len(LIVE))]
    job.bind(torch.tensor(tokens, dtype=torch.int32), None, step.device_gate.words, step.seq)
    job.run_now()
    assert job.state() == 2 and step.device_gate.words.tolist() == [0, 0]  # C left it closed
    step.settle()  # (the loop, before it waits for this step's tokens)
    assert step._error is None and step.device_gate.words.tolist() == [7, 0]
    assert all(step.matchers[j].is_terminated() for j in done)
    assert all(step.bitmask[j].eq(-1).all() for j in done)  # a terminated row: every token allowed
    backend = mgr._get_backend()  # the live rows: as the Python accept + fill gives them
    ok = backend.accept_tokens(ref_step.matchers, tokens)
    assert all(ok)
    ref = torch.zeros_like(step.bitmask)
    backend.fill_bitmasks(ref_step.matchers, ref)
    assert torch.equal(step.bitmask, ref)
    mgr._inflight = None


def test_a_failed_call_fails_the_step_by_name_and_lets_the_device_go(mgr, monkeypatch):  # noqa: F811
    monkeypatch.setattr(xn, "POOL_THREADS", 2)
    out, _ = schedule(mgr, LIVE)
    rows = mgr.prepare(out).bitmask
    bad = torch.zeros(rows.shape[0], rows.shape[1] - 1, dtype=torch.int32)  # rows too short: xgrammar's fill fails
    _, step, job = _chained_step(mgr, LIVE, bitmask=bad)
    step.bitmask = bad
    job.bind(torch.zeros(len(LIVE), dtype=torch.int64), None, step.device_gate.words, step.seq)
    job.run_now()
    assert job.state() == 2 and step.device_gate.words.tolist() == [0, 0]
    step.settle()
    assert step.device_gate.words.tolist() == [7, 0] and bool(bad.eq(-1).all())  # opened on safe rows
    with pytest.raises(Exception, match="(?i)shape|bitmask"):
        step.wait()
    mgr._inflight = None


def test_a_lost_job_fails_the_step_without_waiting(mgr):  # noqa: F811
    _, step, job = _chained_step(mgr, OPEN)
    grammar_chain.launch(type("G", (), {"inner": step})(), None, None)  # no previous copy: nothing to read
    assert step.chain.lost
    step.settle()
    assert step.device_gate.words.tolist() == [7, 0]
    with pytest.raises(RuntimeError, match="OCTAVO_GRAMMAR_CHAIN=0"):
        step.wait()
    mgr._inflight = None


def test_who_fills_is_decided_when_the_gate_is_made(mgr, monkeypatch):  # noqa: F811
    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", False)  # not device-gated: the Python path, job freed
    out, step, job = _chained_step(mgr, OPEN)
    step.chain.owner, step.seq = None, 0
    gate = GatedGrammarStep(step, out)
    assert step.chain is None and not job.busy and gate.seq == 0
    mgr._inflight = None


def test_the_switch_is_honored_or_refused_by_name():
    import os
    import subprocess
    import sys

    code = "from octavo.core import grammar_chain as c; print(c.CHAIN, c.on())"
    cases = (({"OCTAVO_GRAMMAR_CHAIN": "1"}, "True True"), ({"OCTAVO_GRAMMAR_CHAIN": "0"}, "False False"),
             ({"OCTAVO_GRAMMAR_CHAIN": ""}, "True True"),  # (the default since session 17)
             ({"OCTAVO_GRAMMAR_CHAIN": "", "OCTAVO_GRAMMAR_NATIVE_OPEN": "0"}, "True False"),  # (not set: no refusal)
             ({"OCTAVO_GRAMMAR_CHAIN": "", "OCTAVO_GRAMMAR_NATIVE_START": "1"}, "True False"))
    for extra, want in cases:
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **extra}, capture_output=True,
                             text=True, timeout=120)
        assert out.stdout.strip() == want, out.stderr[-500:]
    for extra in ({"OCTAVO_GRAMMAR_NATIVE_OPEN": "0"}, {"OCTAVO_GRAMMAR_NATIVE_START": "1"}):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OCTAVO_GRAMMAR_CHAIN": "1", **extra},
                             capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and "OCTAVO_GRAMMAR_CHAIN=1" in out.stderr


def test_a_backend_without_a_chained_fill_is_refused_when_set(monkeypatch):
    from octavo.plugins.structured_output.guidance_backend import GuidanceBackend

    monkeypatch.setattr(grammar_chain, "CHAIN", True)
    monkeypatch.setattr(grammar_chain, "CHAIN_EXPLICIT", True)
    with pytest.raises(ValueError, match="OCTAVO_GRAMMAR_CHAIN=1: the structured-output backend 'guidance'"):
        grammar_chain.check_backend(object.__new__(GuidanceBackend), "guidance")
    monkeypatch.setattr(grammar_chain, "CHAIN_EXPLICIT", False)  # (a default: the chain stays off there)
    grammar_chain.check_backend(object.__new__(GuidanceBackend), "guidance")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pool,direct", [(1, False), (4, False), (4, True)])
def test_the_driver_runs_the_job_after_the_event_and_the_device_waits_for_its_word(mgr, monkeypatch, pool,  # noqa: F811
                                                                                  direct):
    """On the GPU: the ids reach pinned memory only after a device sleep; the host function must run after the
    event (else it reads zeros), fill, and open the word the device's wait + apply is queued behind. ``direct``: the
    side stream's wait for the event queued by the driver call too (cuda_grammar_mask.DIRECT_LAUNCH, session 17)."""
    pytest.importorskip("triton")
    from octavo.core.grammar_step import apply_packed
    from octavo.plugins.platforms import cuda_grammar_mask
    from octavo.plugins.platforms.cuda import CudaPlatform
    from octavo.plugins.platforms.cuda_grammar_mask import wait_host_flag

    monkeypatch.setattr(xn, "POOL_THREADS", pool)
    monkeypatch.setattr(cuda_grammar_mask, "DIRECT_LAUNCH", direct)
    ref, tokens, _ = _python_reference(mgr, _tokens(set(mgr.tok.all_special_ids)))
    _, step, job = _chained_step(mgr, OPEN)
    step.device_gate = DeviceGate(pin=True)
    pinned = torch.zeros(step.bitmask.shape, dtype=torch.int32, pin_memory=True)
    step.bitmask = pinned
    job.release()
    job = mgr._get_backend().chain_job(step.matchers, pinned)
    step.chain = Chain(job, frozenset())
    step.chain.claim("runner")
    kernel = CudaPlatform().make_grammar_mask_apply()
    dev = torch.device("cuda")
    ids = torch.zeros(len(tokens), dtype=torch.int64, device=dev)
    torch.cuda._sleep(200_000_000)  # (~0.1 s: the host function is queued long before the ids exist)
    ids.copy_(torch.tensor(tokens, dtype=torch.int64).pin_memory().to(dev, non_blocking=True))
    host = ids.to("cpu", non_blocking=True)
    event = torch.Event(device="cuda")
    event.record()
    grammar_chain.launch(type("G", (), {"inner": step})(), (host, event, step.request_ids), kernel)
    assert job.state() == 0  # queued, not run: the ids are not there yet
    logits = torch.randn(len(tokens), ref.shape[1] * 32, device=dev)
    want = apply_packed(logits.clone().cpu(), list(range(len(tokens))), ref)
    wait_host_flag(step.device_gate.words, step.seq)
    kernel(logits, pinned, None, volatile=True)
    torch.cuda.synchronize()
    assert job.state() == 1 and step.device_gate.words.tolist() == [7, 0]
    assert torch.equal(pinned, ref) and torch.equal(logits.cpu(), want)
    step.settle()
    assert step._error is None
    mgr._inflight = None
