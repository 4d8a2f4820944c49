"""A wall-clock stack sampler for the threads of this process: what each thread is doing, step by step.

Why: on a host-bound GPU step (issue 11: a ~1.3 ms 1.1B decode step, three Python threads sharing the GIL) the
question is not how much CPU a thread burns (``/proc`` schedstat answers that) but where its wall time goes:
running Python, waiting for the GIL, or blocked in a native call (a CUDA sync, an event). A sampler thread
wakes every ``interval_s`` and records, for every other thread, its innermost frame and its innermost frame in
octavo's own code (``sys._current_frames``). The sampler itself takes the GIL for each sample (~10-30 us), so
it slows a host-bound loop by a few percent: use it on a separate, untimed run.

    with StackSampler() as s:
        ...            # the run
    s.report(top=20)   # {thread name: [(share of samples, "innermost  <-  octavo frame"), ...]}
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter


def _where(frame, root: str) -> str:
    inner = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"
    f = frame
    while f is not None and not f.f_code.co_filename.startswith(root):
        f = f.f_back
    own = f"{os.path.relpath(f.f_code.co_filename, root)}:{f.f_code.co_name}:{f.f_lineno}" if f is not None else "-"
    return f"{inner}  <-  {own}"


class StackSampler:
    def __init__(self, interval_s: float = 0.0005, root: str | None = None) -> None:
        self.interval_s = interval_s
        here = os.path.dirname(os.path.abspath(__file__))
        self.root = root or os.path.dirname(here)  # the repo root: octavo's sources (sdk/, core/, plugins/)
        self.counts: dict[str, Counter] = {}
        self.samples = 0
        self.enabled = True  # False: samples are skipped (a caller records only the phases it cares about)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.is_set():
            if not self.enabled:
                time.sleep(self.interval_s)
                continue
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, str(ident))
                self.counts.setdefault(name, Counter())[_where(frame, self.root)] += 1
            self.samples += 1
            time.sleep(self.interval_s)

    def __enter__(self) -> StackSampler:
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def report(self, top: int = 20) -> dict[str, list]:
        out = {}
        for name, c in self.counts.items():
            n = sum(c.values())
            out[name] = [(round(k / n, 3), where) for where, k in c.most_common(top)]
        return {"samples": self.samples, "interval_s": self.interval_s, "threads": out}
