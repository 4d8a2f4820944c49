"""The grammar mask applied on an accelerator (core/grammar_step.py ``apply_packed``: packed int32 rows copied
host -> device through pinned memory, non_blocking, then the CUDA platform's one Triton launch
(plugins/platforms/cuda_grammar_mask.py, ``Platform.make_grammar_mask_apply``) or the
byte-table add on the device) gives exactly the
logits of the host path, on random masks: every row, a subset of rows (``index_add_``), fp32 and bf16, a
vocabulary that is not a multiple of 32, from a pageable and from an already pinned buffer, and greedy picks
of the masked logits are equal. Skipped without CUDA (benchmarks/device/structured.sh runs it on the H100)."""

from __future__ import annotations

import pytest
import torch

from octavo.core import grammar_step
from octavo.core.grammar_step import apply_packed
from octavo.plugins.platforms.cuda import CudaPlatform

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("vocab", [49152, 1000 * 32 + 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [None, [1, 4, 5]])
@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("triton", [True, False])
def test_device_apply_equals_host_apply(vocab, dtype, rows, pinned, triton, monkeypatch):
    monkeypatch.setattr(grammar_step, "PLATFORM_APPLY", triton)
    if triton:
        pytest.importorskip("triton")
    g = torch.Generator().manual_seed(vocab + len(rows or []))
    n = 6
    logits = torch.randn(n, vocab, generator=g).to(dtype)
    rows = rows or list(range(n))
    packed = torch.randint(-2**31, 2**31 - 1, (len(rows), (vocab + 31) // 32), dtype=torch.int32, generator=g)
    packed[0, :] = -1  # one row fully open
    if pinned:
        packed = packed.pin_memory()
    kernel = CudaPlatform().make_grammar_mask_apply()
    assert kernel is not None or not triton
    host = apply_packed(logits.clone(), rows, packed)
    dev = apply_packed(logits.to("cuda"), rows, packed, kernel=kernel)
    torch.cuda.synchronize()
    assert dev.device.type == "cuda"
    assert torch.equal(dev.cpu(), host)
    assert torch.equal(dev.argmax(-1).cpu(), host.argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_reads_pinned_rows_directly(dtype, monkeypatch):
    """Every row masked from a pinned buffer: the Triton apply reads the rows from host memory (no copy call,
    ``HOST_READ_APPLY``), same bits as the host path and as the copy-first path; a pageable buffer is copied."""
    pytest.importorskip("triton")
    monkeypatch.setattr(grammar_step, "_TABLES", {})
    g = torch.Generator().manual_seed(7)
    vocab, n = 49152, 32
    logits = torch.randn(n, vocab, generator=g).to(dtype)
    packed = torch.randint(-2**31, 2**31 - 1, (n, vocab // 32), dtype=torch.int32, generator=g)
    packed[3, :] = -1
    kernel = CudaPlatform().make_grammar_mask_apply()
    host = apply_packed(logits.clone(), list(range(n)), packed)
    pinned = packed.pin_memory()  # held: the kernel reads it after the launch returns
    direct = apply_packed(logits.to("cuda"), list(range(n)), pinned, kernel=kernel)
    torch.cuda.synchronize()
    assert grammar_step._TABLES.get("host_read_ok") and not grammar_step._TABLES.get("host_read_failed")
    monkeypatch.setattr(grammar_step, "HOST_READ_APPLY", False)
    copied = apply_packed(logits.to("cuda"), list(range(n)), pinned, kernel=kernel)
    assert torch.equal(direct.cpu(), host) and torch.equal(copied.cpu(), host)


class _ClosedBackend:
    """A grammar backend whose every row allows nothing but token 0 (no tokenizer needed)."""

    def matcher(self, compiled):
        return object()

    def fill_bitmasks(self, matchers, bitmask):
        bitmask[: len(matchers)] = 0
        bitmask[: len(matchers), 0] = 1

    def accept_tokens(self, matchers, tokens):
        return [True] * len(matchers)


def test_manager_pins_its_fill_buffer_once_its_runner_applied_on_the_device():
    """The manager asks the platform whether host memory can be pinned (no ``torch.cuda`` call of its own) and
    pins its reused fill buffer once this process's runner applied masks on the accelerator; the first step's
    copy goes through a fresh pinned staging copy; both steps mask the same."""
    from concurrent.futures import Future

    from octavo.config import OctavoSettings
    from octavo.core.grammar_step import HANDOFF_WAIT_S, mask_logits
    from octavo.core.messages import EngineCoreRequest
    from octavo.core.request import Request
    from octavo.core.scheduler import ScheduledRequest
    from octavo.core.structured_output import RequestGrammar, StructuredOutputManager
    from octavo.sampling_params import SamplingParams

    mgr = StructuredOutputManager(OctavoSettings.from_kwargs(), 1000, [2], CudaPlatform())
    mgr._backend = _ClosedBackend()
    reqs = [Request(EngineCoreRequest(f"p{i}", [1], SamplingParams(), 0.0), 8) for i in range(3)]
    for r in reqs:
        fut = Future()
        fut.set_result("compiled")
        r.grammar = RequestGrammar(fut)

    class Out:
        scheduled = [ScheduledRequest(r, 1, 0, [0]) for r in reqs]

    ids = [r.request_id for r in reqs]
    kernel = CudaPlatform().make_grammar_mask_apply()
    try:
        results = []
        for _ in range(2):
            step = mgr.prepare(Out)
            pinned, wait_s = mgr._bitmask.is_pinned(), step.handoff_wait_s
            logits = torch.randn(3, 1000, device="cuda")
            results.append((pinned, wait_s, mask_logits(logits, None, ids, lambda rows: rows, step, kernel).cpu()))
            mgr.accept_tokens([])
        assert [r[:2] for r in results] == [(False, 0.0), (True, HANDOFF_WAIT_S)]
        for _, _, got in results:
            assert torch.isfinite(got[:, 0]).all() and torch.isinf(got[:, 1:]).all()
    finally:
        mgr.shutdown()


@pytest.mark.parametrize("graph", [False, True, "direct", "lean"])
@pytest.mark.parametrize("whole", [True, False])
def test_device_gate_waits_for_rows_written_after_the_launch(whole, graph, monkeypatch):
    """The device gate (core/grammar_device_gate.py): the wait and the volatile apply are queued before the host
    writes the rows; the stream stays busy until the host opens the word; the masked logits equal the host path;
    the same pinned buffer rewritten for a second step gives that step's bits (no stale rows); a wait nobody
    opens gives up and the host's check fails the step. ``graph``: the wait + apply replayed as one CUDA graph
    (GRAPH, session 12) on the whole-batch step (the subset step still launches them: it needs a row index);
    "direct": that graph launched through the CUDA driver calls (cuda_grammar_mask.DIRECT_LAUNCH, session 15); "lean":
    in place on the logits, the step number counted on the device (cuda_grammar_mask.LEAN, session 17)."""
    pytest.importorskip("triton")
    import time
    from types import SimpleNamespace

    from octavo.core import grammar_device_gate
    from octavo.core.grammar_device_gate import DeviceGate, apply_gated
    from octavo.core.grammar_step import GrammarStep

    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", True)
    from octavo.plugins.platforms import cuda_grammar_mask

    monkeypatch.setattr(grammar_device_gate, "GRAPH", bool(graph))
    monkeypatch.setattr(cuda_grammar_mask, "DIRECT_LAUNCH", graph == "direct")
    monkeypatch.setattr(cuda_grammar_mask, "LEAN", graph == "lean")
    kernel = CudaPlatform().make_grammar_mask_apply()
    monkeypatch.setattr(kernel.gated_graphs, "CAPTURE_AFTER", 1)  # (the engine captures on a shape's 3rd step)
    replays, direct = kernel.gated_graphs.replays, kernel.gated_graphs.direct
    lean = kernel.gated_graphs.lean_replays
    dg = DeviceGate()
    assert dg.words.is_pinned()
    vocab, n = 49152, 8
    buf = torch.zeros(n, vocab // 32, dtype=torch.int32, pin_memory=True)
    rids = [f"r{j}" for j in range(n)]
    sample_ids = rids if whole else ["free", *rids]
    g = torch.Generator().manual_seed(11)
    from octavo.plugins.platforms.cuda_grammar_mask import wait_host_flag

    # every kernel loaded before a wait is queued: a first launch loads its module lazily, which waits for the device,
    # i.e. for the queued wait, which this thread opens only after the call (b1 session 12: a ~20 s stall, then the
    # give-up). The wait (seq 0 passes at once) here; apply_gated builds its own apply on a scratch copy first.
    wait_host_flag(dg.words, 0)
    torch.cuda.synchronize()
    for step_no in range(2):
        inner = GrammarStep(None, list(range(n)), rids, [None] * n, buf, None)
        inner.device_gate, inner.seq = dg, dg.next_seq()
        gate = SimpleNamespace(inner=inner, seq=inner.seq, apply_s=0.0)
        logits = torch.randn(len(sample_ids), vocab, generator=g)
        dev = apply_gated(logits.to("cuda"), gate, sample_ids, lambda rows: rows, kernel)
        time.sleep(0.05)
        assert not torch.cuda.current_stream().query()  # the device waits for the host's word
        rows = torch.randint(-2**31, 2**31 - 1, (n, vocab // 32), dtype=torch.int32, generator=g)
        rows[step_no] = -1
        buf.copy_(rows)  # the fill, after the launch
        dg.open(inner.seq)
        torch.cuda.synchronize()
        dg.check(inner.seq)
        want = apply_packed(logits.clone(), list(range(len(sample_ids) - n, len(sample_ids))), rows)
        assert torch.equal(dev.cpu(), want), step_no
    assert not grammar_device_gate._GRAPH_FAILED
    assert kernel.gated_graphs.replays - replays == (2 if graph and whole else 0)
    assert kernel.gated_graphs.direct - direct == (2 if graph == "direct" and whole else 0), cuda_grammar_mask._DRIVER
    assert kernel.gated_graphs.lean_replays - lean == (2 if graph == "lean" and whole else 0)
    from octavo.plugins.platforms.cuda_grammar_mask import GatedApplyGraphs, wait_host_flag

    if graph:  # the graph's wait gives up too (its own spin bound, captured)
        logits = torch.randn(n, vocab, device="cuda")
        short = GatedApplyGraphs(max_spins=1000)
        short.CAPTURE_AFTER = 1
        assert short.run(logits, buf, dg.words, dg.next_seq()) is not None  # never opened
    else:
        wait_host_flag(dg.words, dg.next_seq(), max_spins=1000)  # never opened
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="grammar masks"):
        dg.check(dg.seq)


@pytest.mark.parametrize("direct", [False, True])
def test_lean_graph_counts_the_step_number_on_the_device(direct, monkeypatch):
    """cuda_grammar_mask.LEAN (session 17): one lean graph over one logits buffer, replayed for consecutive step numbers
    (the host sets the device's step word only on the first replay) and after a skipped number (set again): every
    replay waits for its own number (the stream stays busy until the host opens it, a stale or early number would
    let it pass) and masks in place exactly as the host path; a wait nobody opens gives up. ``direct``: launched by
    the CUDA driver calls (DIRECT_LAUNCH)."""
    pytest.importorskip("triton")
    import time

    from octavo.core.grammar_device_gate import DeviceGate
    from octavo.plugins.platforms import cuda_grammar_mask
    from octavo.plugins.platforms.cuda_grammar_mask import GatedApplyGraphs, wait_host_flag

    monkeypatch.setattr(cuda_grammar_mask, "DIRECT_LAUNCH", direct)

    graphs = GatedApplyGraphs()
    graphs.CAPTURE_AFTER = 2  # (the first step takes the copying path: False)
    dg = DeviceGate()
    vocab, n = 49152, 8
    buf = torch.zeros(n, vocab // 32, dtype=torch.int32, pin_memory=True)
    logits = torch.empty(n, vocab, device="cuda")
    g = torch.Generator().manual_seed(5)
    wait_host_flag(dg.words, 0)  # (the kernel's module loaded before a wait is queued)
    torch.cuda.synchronize()
    seqs, results = [], []
    for step_no in range(5):
        seq = dg.next_seq()
        if step_no == 3:
            dg.open(seq)  # a step that never reaches this graph (e.g. a subset step): the next number is not consecutive
            seq = dg.next_seq()
        host = torch.randn(n, vocab, generator=g)
        logits.copy_(host)
        results.append(graphs.run_lean(logits, buf, dg.words, seq))
        if not results[-1]:
            torch.cuda.synchronize()
            continue
        seqs.append(seq)
        time.sleep(0.05)
        assert not torch.cuda.current_stream().query(), step_no  # waits for this step's own number
        rows = torch.randint(-2**31, 2**31 - 1, (n, vocab // 32), dtype=torch.int32, generator=g)
        rows[step_no % n] = -1
        buf.copy_(rows)
        dg.open(seq)
        torch.cuda.synchronize()
        dg.check(seq)
        assert torch.equal(logits.cpu(), apply_packed(host.clone(), list(range(n)), rows)), step_no
    assert results == [False, True, True, True, True]
    assert graphs.lean_replays == 4 and graphs.lean_sets == 2  # the first replay and the one after the skipped number
    assert graphs.direct == (4 if direct else 0), cuda_grammar_mask._DRIVER
    short = GatedApplyGraphs(max_spins=1000)
    short.CAPTURE_AFTER = 1
    assert short.run_lean(logits, buf, dg.words, dg.next_seq())  # never opened
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="grammar masks"):
        dg.check(dg.seq)
