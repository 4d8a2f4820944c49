"""The device gate (core/grammar_device_gate.py): under async scheduling a structured step's sampling is queued
behind a wait on a host word instead of parked on a Python gate. Without a device: every row is filled where the
launch put it (no dropping of open or finished rows) and the word opens after the rows, also when the fill runs
on the bitmask thread or fails; release() never blocks on it; a wait that gave up fails the step on the host; the
runner's side queues the wait before the apply. End to end on the embedded SmolLM2 with a host-side stand-in for
the device wait (the step thread blocks where the GPU stream would): token-identical to the serial path, every
JSON output valid. The wait kernel itself: mask_triton_cases.py (Triton's interpreter) and, on a GPU,
test_apply_device.py."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch

from octavo.core import async_gate, grammar_device_gate
from octavo.core.async_gate import GatedGrammarStep
from octavo.core.grammar_device_gate import DeviceGate, apply_gated
from octavo.core.grammar_step import GrammarStep, apply_packed


class _Backend:
    """Fills row j with the word ``matchers[j]``; optionally blocks until ``go`` is set, or fails."""

    def __init__(self, go: threading.Event | None = None, fail: bool = False) -> None:
        self.go, self.fail, self.threads = go, fail, []

    def fill_bitmasks(self, matchers, bitmask):
        self.threads.append(threading.current_thread().name)
        if self.go is not None:
            self.go.wait(10)
        if self.fail:
            raise RuntimeError("fill failed")
        for j, m in enumerate(matchers):
            bitmask[j].fill_(m)


@pytest.fixture
def device_gate_on(monkeypatch):
    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", True)


def _gate(backend, n: int, finished=(), dg: DeviceGate | None = None, pool=None) -> GatedGrammarStep:
    inner = GrammarStep(backend, list(range(n)), [f"r{j}" for j in range(n)], [-1 if j == 0 else 10 + j
                                                                                 for j in range(n)],
                        torch.zeros(n + 2, 4, dtype=torch.int32), pool or ThreadPoolExecutor(1, "octavo-bitmask"))
    inner.device_gate = dg or DeviceGate(pin=False)
    sched = SimpleNamespace(scheduled=[SimpleNamespace(req=SimpleNamespace(is_finished=j in finished))
                                       for j in range(n)])
    return GatedGrammarStep(inner, sched)


def test_rows_stay_in_place_and_the_word_opens_after_the_fill(device_gate_on):
    dg = DeviceGate(pin=False)
    gate = _gate(_Backend(), 3, finished=(1,), dg=dg)
    assert gate.seq == 1 and dg.words.tolist() == [0, 0]
    ran = []
    assert gate.park(lambda: ran.append(threading.current_thread().name) or "queued") == "queued"
    assert ran == [threading.current_thread().name]  # the runner queues everything at once: nothing parked
    gate.release()
    assert dg.words.tolist() == [1, 0]
    rids, positions, rows = gate.wait()
    # every row, where the launch put it: the finished request's and the fully open (-1) one too
    assert rids == ["r0", "r1", "r2"] and positions == [0, 1, 2] and rows[:, 0].tolist() == [-1, 11, 12]
    second = _gate(_Backend(), 2, dg=dg)
    assert second.seq == 2  # one rising number per step of the engine


def test_not_enabled_keeps_the_python_gate(monkeypatch):
    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", False)  # (OCTAVO_GRAMMAR_DEVICE_GATE=0)
    gate = _gate(_Backend(), 3)
    assert gate.seq == 0
    assert not isinstance(gate.park(lambda: "x"), str)  # parked (a PendingOutput)


@pytest.mark.parametrize("device", [True, False])
def test_the_early_fill_start_wait_is_chosen_by_the_gate_kind(device, monkeypatch):
    """The core thread's wait for the bitmask thread to start the fill: DEVICE_GATE_FILL_START_WAIT_S under the
    device gate (the device waits for the fill), FILL_START_WAIT_S under the Python gate (this thread will)."""
    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", device)
    monkeypatch.setattr(async_gate, "FILL_START_WAIT_S", 0.25)
    monkeypatch.setattr(async_gate, "DEVICE_GATE_FILL_START_WAIT_S", 0.0)
    seen = []
    start = GrammarStep.start_on_pool

    def spy(self, started_wait_s=0.0, before=None):
        seen.append(started_wait_s)
        return start(self, started_wait_s, before)
    monkeypatch.setattr(GrammarStep, "start_on_pool", spy)
    gate = _gate(_Backend(), async_gate.EARLY_FILL_MIN_ROWS)
    assert bool(gate.seq) == device
    gate.start_fill()
    gate.release()
    rids, _, rows = gate.wait()
    n = async_gate.EARLY_FILL_MIN_ROWS
    assert seen == [0.0 if device else 0.25] and len(rids) == (n if device else n - 1)  # (Python gate: open row dropped)
    assert not device or gate.inner.device_gate.words[0] == gate.seq  # (the fill opened the device's word)


def test_early_fill_opens_the_word_from_the_bitmask_thread_and_release_does_not_wait(device_gate_on, monkeypatch):
    monkeypatch.setattr(async_gate, "DEVICE_GATE_FILL_START_WAIT_S", 0.0)
    go = threading.Event()
    backend = _Backend(go)
    gate = _gate(backend, async_gate.EARLY_FILL_MIN_ROWS)
    gate.start_fill()
    t0 = time.perf_counter()
    gate.release()  # the fill is still blocked: release returns without it
    assert time.perf_counter() - t0 < 5 and gate.inner.device_gate.words[0] == 0
    go.set()
    gate.inner.wait()
    assert gate.inner.device_gate.words[0] == gate.seq and backend.threads[0].startswith("octavo-bitmask")


def test_small_step_fills_at_the_accept(device_gate_on):
    gate = _gate(_Backend(), 2)
    gate.start_fill()  # (the hook called right after the previous step's tokens were accepted)
    assert gate.is_released() and gate.inner.device_gate.words[0] == gate.seq


def test_failed_fill_still_opens_the_word_and_fails_on_the_host(device_gate_on):
    gate = _gate(_Backend(fail=True), 2)
    gate.release()
    assert gate.inner.device_gate.words[0] == gate.seq  # the device does not spin until its time-out
    with pytest.raises(RuntimeError, match="fill failed"):
        gate.inner.wait()


def test_a_wait_that_gave_up_fails_the_step():
    dg = DeviceGate(pin=False)
    dg.check(3)
    dg.words[1] = 3  # what the wait kernel writes when it gives up
    with pytest.raises(RuntimeError, match="step 3"):
        dg.check(3)
    dg.check(4)  # a later step's wait did not give up


class _Kernel:
    """A platform apply with a device wait, on host tensors: records the calls in order."""

    def __init__(self) -> None:
        self.calls = []

    def wait_host_flag(self, words, seq):
        self.calls.append(("wait", seq))

    def __call__(self, logits, packed, index, volatile=False):
        self.calls.append(("apply", None if index is None else index.tolist(), volatile))
        rows = list(range(len(packed))) if index is None else index.tolist()
        return apply_packed(logits, rows, packed)


def test_runner_queues_the_wait_before_the_apply(device_gate_on):
    gate = _gate(_Backend(), 3)
    gate.release()
    kernel = _Kernel()
    logits = torch.randn(4, 128)
    # sampling rows: r1, a free request, r0, r2 -> the grammar rows are logits rows 2, 0, 3
    out = apply_gated(logits.clone(), gate, ["r1", "free", "r0", "r2"], lambda rows: rows, kernel)
    assert kernel.calls == [("wait", gate.seq), ("apply", [2, 0, 3], True)]
    assert torch.equal(out, apply_packed(logits.clone(), [2, 0, 3], gate.inner.bitmask[:3]))


class _HostWait(_Kernel):
    """The device wait stood in for on a CPU: the step thread blocks until the host opened the word (the GPU
    stream would), then the core's apply."""

    def wait_host_flag(self, words, seq):
        deadline = time.monotonic() + 30
        while int(words[0]) < seq:
            if time.monotonic() > deadline:
                words[1] = seq
                return
            time.sleep(0.0002)
        self.calls.append(("wait", seq))


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "n"], "additionalProperties": False}


def parity_engine():
    """The engine and requests of the token-parity tests (here and test_grammar_worker.py): the default model in
    float32, synchronous to start, 12 rows at most, no prefix cache; nine schema-constrained greedy rows of growing
    length, a sampled constrained row and an unconstrained row in the same steps. Returns (llm, params, prompts)."""
    from octavo import LLM, SamplingParams
    from octavo.core.loader import default_model_path
    from octavo.structured_outputs import StructuredOutputsParams

    llm = LLM(default_model_path(), dtype="float32", quantization="none", seed=0, max_model_len=384,
              max_num_seqs=12, enable_prefix_caching=False, async_scheduling=False)
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    params = [SamplingParams(temperature=0.0, max_tokens=6 + 3 * i, structured_outputs=so) for i in range(9)]
    params.append(SamplingParams(temperature=0.8, seed=7, max_tokens=28, structured_outputs=so))
    params.append(SamplingParams(temperature=0.0, max_tokens=8))  # an unconstrained row in the same steps
    prompts = [f"Describe fruit number {i} as JSON with a name and n." for i in range(len(params))]
    return llm, params, prompts


def parity_rows(outs) -> list[tuple]:
    """(token ids, finish reason, text) of each request's first completion."""
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason, o.outputs[0].text) for o in outs]


def assert_finished_rows_match_schema(rows, params, jsonschema) -> None:
    """Every constrained row that stopped on its own is JSON valid under SCHEMA."""
    import json

    for (_, reason, text), p in zip(rows, params):
        if p.structured_outputs is not None and reason == "stop":
            jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.slow
def test_device_gate_tokens_identical_to_serial(monkeypatch):
    pytest.importorskip("xgrammar")
    jsonschema = pytest.importorskip("jsonschema")
    from octavo.core import structured_output as so_mod
    from octavo.core.async_engine import AsyncStepLoop, set_async_scheduling
    from octavo.executor import Executor

    llm, params, prompts = parity_engine()
    core = llm.llm_engine.core
    runner = core.executor.driver.runner
    ex_cls = type(core.executor)
    overlapped = ex_cls.execute_structured

    def run(mode: str):
        set_async_scheduling(core, mode != "serial")
        with monkeypatch.context() as m:
            m.setattr(ex_cls, "execute_structured", Executor.execute_structured if mode == "serial" else overlapped)
            if mode.startswith("gate"):
                m.setattr(grammar_device_gate, "DEVICE_GATE", True)
                m.setattr(grammar_device_gate, "NATIVE_OPEN", False)  # (the Python fill; test_native_open.py: native)
                if mode == "gate_poolaccept":  # N's accept in the fill job on the bitmask thread, from 2 rows
                    m.setattr(so_mod, "ACCEPT_ON_FILL_THREAD", True)
                    m.setattr(async_gate, "EARLY_FILL_MIN_ROWS", 2)
                if mode == "gate_d3":  # three steps in flight: N+2's wait, apply and sampler queued before N's tokens
                    core.async_loop.depth = 3
                    launch = AsyncStepLoop._launch

                    def counted(loop):
                        out = launch(loop)
                        depths.append(len(loop.inflight))
                        return out
                    m.setattr(AsyncStepLoop, "_launch", counted)
                m.setattr(runner, "grammar_apply", kernel)
                m.setitem(core.structured._cpu_hint, "device_wait", True)  # (set by a GPU runner's first apply)
            return parity_rows(llm.generate(prompts, params, use_tqdm=False))

    kernel = _HostWait()
    depths = []
    try:
        serial = run("serial")
        gated = run("gate")
        pooled = run("gate_poolaccept")
        deep = run("gate_d3")
    finally:
        set_async_scheduling(core, False)
        llm.llm_engine.shutdown()
    waits = [c for c in kernel.calls if c[0] == "wait"]
    assert len(waits) > 10 and core.structured._device_gate.words[1] == 0  # the device path ran, never gave up
    assert max(depths) == 3  # a third step was queued behind device-gated ones
    assert [s[:2] for s in serial] == [g[:2] for g in gated] == [p[:2] for p in pooled] == [d[:2] for d in deep]
    assert_finished_rows_match_schema(serial, params, jsonschema)


def test_accept_goes_with_the_fill_job_only_under_the_device_gate(device_gate_on, monkeypatch):
    """structured_output.ACCEPT_ON_FILL_THREAD: the previous step's accept (``before``) runs on the bitmask thread
    right before the fill, in the same job; a small step or a Python-gated one runs it here, first; a failed
    accept still fills and opens the word, and its error reaches the host."""
    monkeypatch.setattr(async_gate, "DEVICE_GATE_FILL_START_WAIT_S", 0.0)
    order = []

    def before():
        order.append(("accept", threading.current_thread().name))

    backend = _Backend()
    gate = _gate(backend, async_gate.EARLY_FILL_MIN_ROWS)
    gate.start_fill(before)
    gate.inner.wait()
    assert order[0][0] == "accept" and order[0][1].startswith("octavo-bitmask")
    assert backend.threads == [order[0][1]] and gate.inner.device_gate.words[0] == gate.seq
    here = threading.current_thread().name
    order.clear()
    _gate(_Backend(), 2).start_fill(before)  # too few rows for the thread: here, then filled inline
    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", False)
    _gate(_Backend(), async_gate.EARLY_FILL_MIN_ROWS).start_fill(before)  # the Python gate: here
    assert order == [("accept", here), ("accept", here)]
    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", True)

    def broken():
        raise RuntimeError("accept failed")

    gate = _gate(_Backend(), async_gate.EARLY_FILL_MIN_ROWS)
    gate.start_fill(broken)
    with pytest.raises(RuntimeError, match="accept failed"):
        gate.inner.wait()
    assert gate.inner.device_gate.words[0] == gate.seq


def test_env_switch_is_honored_or_refused():
    import subprocess
    import sys

    code = "from octavo.core import grammar_device_gate as g; print(g.DEVICE_GATE)"
    for value, want in (("1", "True"), ("0", "False"), ("", "True")):  # on by default since session 10
        env = {**__import__("os").environ, "OCTAVO_GRAMMAR_DEVICE_GATE": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == want, out.stderr[-500:]
    env = {**__import__("os").environ, "OCTAVO_GRAMMAR_DEVICE_GATE": "yes"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "OCTAVO_GRAMMAR_DEVICE_GATE='yes'" in out.stderr


class _Graphs:
    """A platform's wait + apply graph stood in for: counts its replays, masks a copy like the real one."""

    def __init__(self) -> None:
        self.replays = 0

    def run(self, logits, packed, words, seq):
        self.replays += 1
        return apply_packed(logits.clone(), list(range(len(packed))), packed)


def test_graph_taken_on_the_whole_step_only_and_never_without_graphs(device_gate_on, monkeypatch):
    """GRAPH (session 12): the usual decode step (every row, in order) goes through the platform's graph and gives
    the two launches' logits; a step needing a row index launches them; an engine that runs eagerly
    (enforce_eager: the manager's DeviceGate(graphs=False)) never takes the graph."""
    monkeypatch.setattr(grammar_device_gate, "GRAPH", True)
    kernel = _Kernel()
    kernel.gated_graphs = _Graphs()
    for graphs, rows, replays in ((True, ["r0", "r1", "r2"], 1), (True, ["r1", "free", "r0", "r2"], 0),
                                  (False, ["r0", "r1", "r2"], 0)):
        kernel.gated_graphs.replays, kernel.calls = 0, []
        gate = _gate(_Backend(), 3, dg=DeviceGate(pin=False, graphs=graphs))
        gate.release()
        logits = torch.randn(len(rows), 128)
        out = apply_gated(logits.clone(), gate, rows, lambda r: r, kernel)
        want = [rows.index(r) for r in ("r0", "r1", "r2")]
        assert torch.equal(out, apply_packed(logits.clone(), want, gate.inner.bitmask[:3]))
        assert kernel.gated_graphs.replays == replays and (kernel.calls == []) == (replays == 1), (graphs, rows)


def test_manager_gate_has_no_graphs_under_enforce_eager():
    from octavo.config import OctavoSettings
    from octavo.core.structured_output import StructuredOutputManager

    for eager in (False, True):
        mgr = StructuredOutputManager(OctavoSettings.from_kwargs(enforce_eager=eager), 128, [2])
        mgr._backend = SimpleNamespace(fill_bitmasks=lambda ms, bm: None)
        mgr._cpu_hint["device_wait"] = True  # (set by a GPU runner's first apply)
        req = SimpleNamespace(request_id="r0", grammar=SimpleNamespace(matcher=object(), failed=None))
        mgr.prepare(SimpleNamespace(scheduled=[SimpleNamespace(req=req, samples=True)]))
        assert mgr._device_gate.graphs is (not eager)
