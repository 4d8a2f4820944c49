"""Probe of the device gate's wait on a GPU (issue 11, session 9; core/grammar_device_gate.py): does the one-warp
Triton wait see a host write to pinned memory, what do its first compile and each launch cost the host, how long is
one spin (one read of the host word), how soon after the host's write does the stream go on, and does the volatile
apply read rows written after its launch (two rounds on one buffer). Bounded: a wait nobody opens gives up after
``2**20`` spins here.

    python benchmarks/structured_devgate_probe.py [--json OUT] [--launch-only]

``--launch-only`` (session 10): the host cost of each launch of the apply (rows pinned, on the device, or the pinned
rows passed as a bare pointer; behind an open or a spinning wait) and of the wait; session 12: the wait + apply pair
as the engine launches it vs one replay of its CUDA graph (GatedApplyGraphs), and whether their bits are equal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _resume(dg, wait_host_flag, sleep_s: float, max_spins: int) -> dict:
    """Queue a wait for a new step number, open it from the host after ``sleep_s``; how long until the stream is done."""
    seq = dg.next_seq()
    wait_host_flag(dg.words, seq, max_spins)
    time.sleep(sleep_s)
    busy = not torch.cuda.current_stream().query()
    t_open = time.perf_counter()
    dg.open(seq)
    stream = torch.cuda.current_stream()
    while not stream.query():
        if time.perf_counter() - t_open > 60:
            break
    return {"busy_before_open": busy, "resume_after_open_us": round((time.perf_counter() - t_open) * 1e6, 1),
            "gave_up": int(dg.words[1]) >= seq}


class _HostRows:
    """The pinned rows as a bare pointer (``data_ptr`` + ``dtype``): what Triton's launcher reads of a tensor
    argument, without the tensor."""

    def __init__(self, t: torch.Tensor) -> None:
        self._ptr, self.dtype = t.data_ptr(), t.dtype

    def data_ptr(self) -> int:
        return self._ptr


def launch_costs(n: int = 32, vocab: int = 49152, iters: int = 60) -> dict:
    """Host microseconds per launch (median of ``iters``, the stream drained before each) of the grammar apply with
    its rows (a) in pinned host memory as the engine passes them (volatile and not), (b) on the device, (c) the same
    pinned rows as a bare pointer (:class:`_HostRows`), and of the device wait; (c)'s result is compared with (a)'s."""
    import triton

    from octavo.plugins.platforms.cuda_grammar_mask import (
        BLOCK,
        GatedApplyGraphs,
        _apply_bitmask_kernel,
        apply_bitmask_,
        wait_host_flag,
    )

    g = torch.Generator().manual_seed(3)
    rows = torch.randint(-2**31, 2**31 - 1, (n, (vocab + 31) // 32), dtype=torch.int32, generator=g)
    pinned, dev_rows = rows.pin_memory(), rows.cuda()
    logits = torch.randn(n, vocab, device="cuda")
    words = torch.zeros(2, dtype=torch.int32, pin_memory=True)
    bare = _HostRows(pinned)

    def bare_apply(x):
        _apply_bitmask_kernel[(n, triton.cdiv(vocab, BLOCK))](x, x.stride(0), bare, pinned.shape[1], bare, vocab,
                                                            HAS_ROWS=False, BLOCK=BLOCK, VOLATILE=True)

    cases = {"apply_pinned_volatile": lambda x: apply_bitmask_(x, pinned, None, volatile=True),
             "apply_pinned": lambda x: apply_bitmask_(x, pinned, None),
             "apply_device_rows": lambda x: apply_bitmask_(x, dev_rows, None),
             "apply_bare_pointer": bare_apply,
             "wait_open": lambda x: wait_host_flag(words, 0, 10),
             # session 12: the device gate's pair as the engine queues it (an open word) vs one graph replay
             # (GatedApplyGraphs: seq into a device word, the logits into the graph's buffer, the replay)
             "wait_apply_pair": lambda x: (wait_host_flag(words, 0), apply_bitmask_(x, pinned, None, volatile=True)),
             "wait_apply_graph": lambda x: graphs.run(x, pinned, words, 0)}
    graphs = GatedApplyGraphs()
    graphs.CAPTURE_AFTER = 1  # (captured on the compile call, not on an engine shape's 3rd step)
    out: dict = {}
    for name, fn in cases.items():
        try:
            fn(logits.clone())  # compile
            times = []
            for _ in range(iters):
                x = logits.clone()
                torch.cuda.synchronize()
                t = time.perf_counter()
                fn(x)
                times.append(time.perf_counter() - t)
            out[f"{name}_host_us"] = round(statistics.median(times) * 1e6, 1)
        except Exception as e:  # noqa: BLE001 - a probe: say what failed and go on
            out[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
    # the engine's order: the apply launched right behind a wait that is (b) spinning on a closed word, (a) open;
    # session 9's probe timed 94-98 us for the apply launched behind a closed wait (the stream drained: ~33 us)
    from octavo.core.grammar_device_gate import DeviceGate

    dg = DeviceGate()
    for name, closed in (("apply_behind_open_wait", False), ("apply_behind_spinning_wait", True)):
        try:
            times = []
            for _ in range(iters):
                x = logits.clone()
                torch.cuda.synchronize()
                seq = dg.next_seq()
                if not closed:
                    dg.open(seq)
                wait_host_flag(dg.words, seq, 1 << 22)
                time.sleep(0.0002 if closed else 0.0)  # (the wait is on the device and spinning)
                t = time.perf_counter()
                apply_bitmask_(x, pinned, None, volatile=True)
                times.append(time.perf_counter() - t)
                dg.open(seq)
                torch.cuda.synchronize()
            out[f"{name}_host_us"] = round(statistics.median(times) * 1e6, 1)
            out[f"{name}_gave_up"] = int(dg.words[1]) > 0
        except Exception as e:  # noqa: BLE001
            out[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
    try:
        a, b = logits.clone(), logits.clone()
        apply_bitmask_(a, pinned, None, volatile=True)
        bare_apply(b)
        out["bare_pointer_equal"] = bool(torch.equal(a, b))
    except Exception as e:  # noqa: BLE001
        out["bare_pointer_equal_error"] = f"{type(e).__name__}: {e}"[:300]
    try:  # the graph's masked copy equals the eager pair's logits (and the input is left as it was)
        a, b = logits.clone(), logits.clone()
        apply_bitmask_(a, pinned, None, volatile=True)
        got = graphs.run(b, pinned, words, 0)
        torch.cuda.synchronize()
        out["graph_equal"] = bool(torch.equal(a, got)) and bool(torch.equal(b, logits))
    except Exception as e:  # noqa: BLE001
        out["graph_equal_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--launch-only", dest="launch_only", action="store_true",
                    help="only the launch costs of the apply and the wait (session 10)")
    args = ap.parse_args()
    if args.launch_only:
        out = {"device": torch.cuda.get_device_name(), **launch_costs()}
        print(json.dumps(out, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
        return
    from octavo.core.grammar_device_gate import DeviceGate
    from octavo.core.grammar_step import apply_packed
    from octavo.plugins.platforms.cuda_grammar_mask import apply_bitmask_, wait_host_flag

    out: dict = {"device": torch.cuda.get_device_name()}
    dg = DeviceGate()
    t0 = time.perf_counter()
    wait_host_flag(dg.words, 0, 10)  # already open
    torch.cuda.synchronize()
    out["first_wait_incl_compile_s"] = round(time.perf_counter() - t0, 3)
    launches = []
    for _ in range(50):
        t = time.perf_counter()
        wait_host_flag(dg.words, 0, 10)
        launches.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    out["wait_launch_host_us_median"] = round(statistics.median(launches) * 1e6, 1)
    for n in (1000, 100000):  # nobody opens: the rate of reads of the host word
        seq = dg.next_seq()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        wait_host_flag(dg.words, seq, n)
        e1.record()
        torch.cuda.synchronize()
        out[f"spins_{n}"] = {"us_per_spin": round(e0.elapsed_time(e1) * 1e3 / n, 3),
                             "gave_up_recorded": int(dg.words[1]) == seq}
    out["open_after_5ms"] = [_resume(dg, wait_host_flag, 0.005, 1 << 20) for _ in range(3)]
    out["open_after_0ms"] = [_resume(dg, wait_host_flag, 0.0, 1 << 20) for _ in range(3)]
    # rows written after the launch, behind the wait; the same pinned buffer twice
    g = torch.Generator().manual_seed(5)
    vocab, n = 49152, 32
    buf = torch.zeros(n, vocab // 32, dtype=torch.int32, pin_memory=True)
    apply_bitmask_(torch.zeros(n, vocab, device="cuda"), buf, None, volatile=True)  # compiled before any wait
    torch.cuda.synchronize()
    rounds = []
    for _ in range(2):
        logits = torch.randn(n, vocab, generator=g)
        dev = logits.to("cuda")
        seq = dg.next_seq()
        wait_host_flag(dg.words, seq, 1 << 20)
        t = time.perf_counter()
        apply_bitmask_(dev, buf, None, volatile=True)
        apply_us = (time.perf_counter() - t) * 1e6
        rows = torch.randint(-2**31, 2**31 - 1, (n, vocab // 32), dtype=torch.int32, generator=g)
        time.sleep(0.002)
        buf.copy_(rows)
        dg.open(seq)
        torch.cuda.synchronize()
        want = apply_packed(logits.clone(), list(range(n)), rows)
        rounds.append({"equal": bool(torch.equal(dev.cpu(), want)), "apply_launch_host_us": round(apply_us, 1),
                       "gave_up": int(dg.words[1]) >= seq})
    out["rows_written_after_launch"] = rounds
    out["ok"] = (all(r["equal"] and not r["gave_up"] for r in rounds)
                 and all(not x["gave_up"] for x in out["open_after_5ms"] + out["open_after_0ms"]))
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
