"""Count the Python and C calls each thread makes per engine step (issue 11, session 12: why does a structured step
with no grammar work in the process still cost +17 % on a host-bound GPU step?).

Why counts: on a host-bound step three Python threads share one GIL, so every call any of them makes per step is
host time on the step's critical path, and wall-clock profiles on a loaded host are noise. Call counts do not depend
on the load: the difference between a free and a structured mode's counts is exactly the Python the structured path
adds, per thread, by function. A ``c_call`` is a builtin or extension call made from Python (torch ops included: on a
GPU each one that launches is a launch).

    with CallCounter() as c:   # benchmarks/structured_outputs.py --count-calls MODE ...
        ...                    # the run; c.enabled switches counting on for the steps that matter
    c.report(steps, top=20)    # {thread: {"py": calls/step, "c": calls/step, "top": [(calls/step, function), ...]}}

The profiler slows every call several-fold: use it on a separate, untimed run. Calls inside ``skip`` functions (e.g.
a host stand-in for the device's wait, which spins) are not counted. Python < 3.12 cannot hook threads that already
run: :meth:`arm` before the engine starts its threads hooks every later thread (and slows that process's timings).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections import Counter


class CallCounter:
    def __init__(self, skip: tuple[str, ...] = ()) -> None:
        self.enabled = False
        self.skip = set(skip)  # function names whose calls (and everything below them) are not counted
        self.counts: dict[str, Counter] = {}
        self._names: dict[int, str] = {}
        self._depth_skipped: dict[int, int] = {}  # thread ident -> nesting depth inside a skipped function

    def _thread(self, ident: int) -> str:
        name = self._names.get(ident)
        if name is None:
            name = self._names[ident] = re.sub(r"_\d+$", "", threading.current_thread().name)
        return name

    def _profile(self, frame, event, arg) -> None:
        if not self.enabled:
            return
        ident = threading.get_ident()
        inside = self._depth_skipped.get(ident, 0)
        if event == "call":
            code = frame.f_code
            if inside or code.co_name in self.skip:
                self._depth_skipped[ident] = inside + 1
                return
            key = f"{os.path.basename(code.co_filename)}:{code.co_name}"
        elif event == "return":
            if inside:
                self._depth_skipped[ident] = inside - 1
            return
        elif event == "c_call":
            if inside:
                return
            key = "C " + getattr(arg, "__qualname__", getattr(arg, "__name__", "?"))
        else:
            return
        name = self._thread(ident)
        counts = self.counts.get(name)
        if counts is None:
            counts = self.counts[name] = Counter()
        counts[key] += 1

    def arm(self) -> None:
        """Python < 3.12: hook this thread and every thread started from now on (call before the engine starts)."""
        if not hasattr(threading, "setprofile_all_threads"):
            threading.setprofile(self._profile)
            sys.setprofile(self._profile)

    def __enter__(self) -> CallCounter:
        if hasattr(threading, "setprofile_all_threads"):
            threading.setprofile_all_threads(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        self.enabled = False
        if hasattr(threading, "setprofile_all_threads"):
            threading.setprofile_all_threads(None)

    def report(self, steps: int, top: int = 20) -> dict:
        """Per thread: Python calls and C calls per counted step, and the ``top`` functions by calls per step."""
        out = {}
        for name, counts in sorted(self.counts.items()):
            py = sum(v for k, v in counts.items() if not k.startswith("C "))
            c = sum(v for k, v in counts.items() if k.startswith("C "))
            out[name] = {"py": round(py / max(steps, 1), 1), "c": round(c / max(steps, 1), 1),
                         "top": [(round(v / max(steps, 1), 2), k) for k, v in counts.most_common(top)]}
        return out
