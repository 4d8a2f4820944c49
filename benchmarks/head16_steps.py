"""Every step of a batch-1 generation on the host's and the device's clocks (session 17, engineer head17; issue 9's
``decode_bs1_strict_fraction_of_roofline``: gpu_e2e.py's second window, tokens 258..513, read 0.09-0.13 ms/token
over its first while the device step grows only 3-10 us; session 16's stall diagnostic saw 257-token runs only).

:class:`StepRecorder` wraps, in one in-process engine (uni executor), ``LLMEngine.step`` (the caller's loop: when
each step's outputs came back), the worker's ``execute`` (the step thread: when it started and finished launching a
step) and the cyclic GC (``gc.callbacks``); on CUDA it records a timing event on the step thread's stream right
after each step's launch, so each step's END ON THE DEVICE is known on the host's clock (one reference event
recorded on an idle device at the generation's start: device time 0 = that host instant, +-~10 us).

Per step k this gives: the host interval (between two returns of ``LLMEngine.step``), the device interval (between
two steps' ends on the device: the GPU's own step time when it never waits), and ``late`` = the host's start of
launching step k minus the device's end of step k-1: > 0 means the device ran dry and waited that long for the host
(a host stall that the two steps in flight did not hide); how far ahead the host is otherwise. :func:`summarize`
condenses one generation: per-window means, the steps that ran long (position, host / device / late ms, the GC that
overlapped them), the time before the first and after the last step. Extra cost: one event record per step."""

from __future__ import annotations

import gc
import statistics
import time


class StepRecorder:
    def __init__(self, llm, cuda: bool) -> None:
        self.engine = llm.llm_engine
        self.driver = self.engine.core.executor.driver
        self.cuda = cuda
        self.returns: list[float] = []  # LLMEngine.step returned (main thread)
        self.main_s: list[float] = []  # its wall time
        self.ex_in: list[float] = []  # the worker's execute entered / left (step thread)
        self.ex_out: list[float] = []
        self.events: list = []
        self.gcs: list[tuple[float, int, float]] = []  # (start, generation, ms)
        self._gc_t: dict = {}
        self._orig = None
        self.ref = None
        self.t_ref = 0.0

    def install(self) -> None:
        eng, drv = self.engine, self.driver
        self._orig = (eng.step, drv.execute)
        o_step, o_exec = self._orig

        def step():
            t = time.perf_counter()
            out = o_step()
            t2 = time.perf_counter()
            self.returns.append(t2)
            self.main_s.append(t2 - t)
            return out

        def execute(*a, **k):
            self.ex_in.append(time.perf_counter())
            out = o_exec(*a, **k)
            if self.cuda:
                import torch

                ev = torch.cuda.Event(enable_timing=True)
                ev.record()  # this thread's current stream: behind everything the step launched
                self.events.append(ev)
            self.ex_out.append(time.perf_counter())
            return out

        eng.step, drv.execute = step, execute
        gc.callbacks.append(self._on_gc)

    def remove(self) -> None:
        if self._orig is not None:
            self.engine.step, self.driver.execute = self._orig
            self._orig = None
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase, info) -> None:
        if phase == "start":
            self._gc_t["t"] = time.perf_counter()
        elif "t" in self._gc_t:
            t = self._gc_t.pop("t")
            self.gcs.append((t, info.get("generation", -1), (time.perf_counter() - t) * 1e3))

    def start(self) -> float:
        """Before a generation: clear, and on CUDA pin device time 0 to this host instant (the device is idle)."""
        for lst in (self.returns, self.main_s, self.ex_in, self.ex_out, self.events, self.gcs):
            lst.clear()
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            self.ref = torch.cuda.Event(enable_timing=True)
            self.ref.record()
            torch.cuda.synchronize()
        self.t_ref = time.perf_counter()
        return self.t_ref

    def device_ends(self) -> list[float] | None:
        if not self.cuda:
            return None
        import torch

        torch.cuda.synchronize()
        return [self.t_ref + self.ref.elapsed_time(ev) / 1e3 for ev in self.events]


def _ms(x: float) -> float:
    return round(x * 1e3, 4)


def summarize(rec: StepRecorder, t0: float, t_end: float, slow_us: float = 60.0, top: int = 12) -> dict:
    """One generation (started at ``t0``, ``generate`` returned at ``t_end``); ``slow_us``: a step is listed when its
    host or device interval is this far over the generation's median."""
    ret, ex_in = rec.returns, rec.ex_in
    dev = rec.device_ends()
    host_iv = [b - a for a, b in zip(ret, ret[1:])]
    out: dict = {"wall_ms": _ms(t_end - t0), "engine_steps": len(ret), "executes": len(ex_in),
                 "to_first_return_ms": _ms(ret[0] - t0) if ret else None,
                 "after_last_return_ms": _ms(t_end - ret[-1]) if ret else None,
                 "main_step_max_ms": _ms(max(rec.main_s)) if rec.main_s else None,
                 "execute_max_ms": _ms(max(b - a for a, b in zip(ex_in, rec.ex_out))) if ex_in else None,
                 "gc": [(round(t - t0, 4), g, round(ms, 3)) for t, g, ms in rec.gcs]}
    if ex_in:  # the first step (the prompt's uncached tail): its launch on the host, its end on the device
        out["prefill_launch_ms"] = _ms(rec.ex_out[0] - ex_in[0])
        out["prefill_launch_start_ms"] = _ms(ex_in[0] - t0)
        if dev:
            out["prefill_device_end_ms"] = _ms(dev[0] - t0)
    if len(host_iv) < 4:
        return out
    out["first_interval_ms"] = _ms(host_iv[0])
    steady = host_iv[1:]
    med = statistics.median(steady)
    out["host_median_ms"] = _ms(med)
    half = len(steady) // 2
    out["host_mean_ms_halves"] = [_ms(statistics.mean(steady[:half])), _ms(statistics.mean(steady[half:]))]
    out["host_excess_ms_halves"] = [_ms(sum(x - med for x in steady[:half])), _ms(sum(x - med for x in steady[half:]))]
    rows = []
    if dev is not None and len(dev) == len(ex_in):
        dev_iv = [b - a for a, b in zip(dev, dev[1:])]  # dev_iv[k-1]: end of execute k-1 -> end of execute k
        late = [ex_in[k] - dev[k - 1] for k in range(1, len(dev))]
        d = dev_iv[1:]
        dmed = statistics.median(d)
        dh = len(d) // 2
        out["device_median_ms"] = _ms(dmed)
        out["device_mean_ms_halves"] = [_ms(statistics.mean(d[:dh])), _ms(statistics.mean(d[dh:]))]
        out["device_first_ms"] = _ms(dev_iv[0])  # the prefill step's end -> the first decode step's end
        out["device_excess_ms_halves"] = [_ms(sum(x - dmed for x in d[:dh])), _ms(sum(x - dmed for x in d[dh:]))]
        pos = [x for x in late[1:] if x > 0]
        out["late_steps"] = len(pos)
        out["late_ms_total"] = _ms(sum(pos))
        out["host_ahead_ms_median"] = _ms(-statistics.median(late[1:]))
        out["device_end_to_return_ms"] = _ms(ret[-1] - dev[-1]) if ret else None
        for k in range(2, len(dev)):
            dk = dev_iv[k - 1]
            if dk - dmed > slow_us / 1e6 or late[k - 1] > 0:
                g = [(gen, round(ms, 3)) for t, gen, ms in rec.gcs if dev[k - 1] - 0.01 < t < dev[k]]
                rows.append({"step": k, "device_ms": _ms(dk), "late_ms": _ms(late[k - 1]),
                             "execute_ms": _ms(rec.ex_out[k] - ex_in[k]), "gc": g})
        out["slow_device_steps"] = len(rows)
    else:
        for k, x in enumerate(steady, start=2):
            if x - med > slow_us / 1e6:
                rows.append({"step": k, "host_ms": _ms(x)})
    rows.sort(key=lambda r: -r.get("device_ms", r.get("host_ms", 0)))
    out["slowest"] = rows[:top]
    return out


class StackSampler:
    """A poor man's py-spy: a thread that every ``interval`` seconds notes each other thread's innermost frames
    (``sys._current_frames``), so a step that ran late can be matched with what the host was doing then. Costs the
    GIL for ~20-50 us a sample (a few % of a 3 ms step at 2 ms): use it in its own measures."""

    def __init__(self, interval: float = 0.002, depth: int = 6) -> None:
        import threading

        self.interval, self.depth = interval, depth
        self.samples: list[tuple[float, str, tuple]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="head16-sampler", daemon=True)

    def _run(self) -> None:
        import sys
        import threading

        me = threading.get_ident()
        names = {}
        while not self._stop.wait(self.interval):
            t = time.perf_counter()
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                if tid not in names:
                    names = {th.ident: th.name for th in threading.enumerate()}
                stack = []
                f = frame
                while f is not None and len(stack) < self.depth:
                    stack.append(f"{f.f_code.co_filename.rsplit('/', 2)[-1]}:{f.f_lineno} {f.f_code.co_name}")
                    f = f.f_back
                self.samples.append((t, names.get(tid, str(tid)), tuple(stack)))

    def start(self) -> None:
        self.samples.clear()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float, top: int = 6) -> list:
        """The most frequent (thread, stack) samples in [t0, t1], with their counts."""
        from collections import Counter

        c = Counter((name, stack) for t, name, stack in self.samples if t0 <= t <= t1)
        return [[n, name, list(stack)] for (name, stack), n in c.most_common(top)]
