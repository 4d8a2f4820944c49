"""Probe (not a test): tests/unit/test_gc_heap.py beside a worker thread that holds and drops objects (pytest, N rounds)."""
import random
import sys
import threading
import time

import pytest

stop = False
def churn():
    rng = random.Random(0)
    while not stop:
        keep = [[i] for i in range(500)]
        time.sleep(rng.random() * 0.03)
        del keep
        time.sleep(rng.random() * 0.03)
class Churn:
    def pytest_sessionstart(self, session):
        threading.Thread(target=churn, daemon=True).start()
rcs = [pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[2:]], plugins=[Churn()]) for _ in range(int(sys.argv[1]))]
print("rcs", rcs)
