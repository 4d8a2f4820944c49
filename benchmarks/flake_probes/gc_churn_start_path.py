"""Probe (not a test): tests/unit/test_start_path.py's test_start_gc_pause_ends_frozen_and_enabled beside a thread
that frees older objects (as a thread an earlier test left running can): how often does its freeze check fail?
Arguments: rounds, then ``alone`` to run without that thread."""
import random
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests/ is imported

from tests.unit.test_start_path import test_start_gc_pause_ends_frozen_and_enabled as check  # noqa: E402

stop = False


def churn() -> None:  # holds a result for a while, drops it, idles, makes the next (as request state does)
    rng = random.Random(0)
    while not stop:
        keep = [[i] for i in range(500)]
        time.sleep(rng.random() * 0.03)
        del keep
        time.sleep(rng.random() * 0.03)


if len(sys.argv) < 3:
    threading.Thread(target=churn, daemon=True).start()
fails, last, n = 0, "", int(sys.argv[1])
for _ in range(n):
    try:
        check()
    except AssertionError as e:
        fails += 1
        tb = traceback.extract_tb(e.__traceback__)[-1]
        last = f"line {tb.lineno}: {tb.line}"
stop = True
print(f"{fails}/{n} failed" + (f"; last: {last[:200]}" if fails else ""))
