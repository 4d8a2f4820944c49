"""Data parallelism: ``data_parallel_size`` engine-core processes (one model replica each) behind the one
``EngineCore`` interface, so ``LLM``, ``AsyncLLM`` and the server need no change.

    caller ──add_request──▶ DPEngineCore ──ADD (msgpack)──▶ core i   (the one with fewest requests in flight)
    caller ◀──step()────── merged EngineCoreOutputs ◀─OUTPUTS── every core

Each replica is the ordinary core process (``run_engine_core``: its own scheduler, KV cache and executor,
so a replica may itself be tensor-parallel), started as a fresh interpreter (the server's core process is
daemonic and may not use ``multiprocessing``). Routing is load-aware: a new request goes to the replica with
the fewest unfinished requests. ``EngineCore(settings)`` returns one of these when ``data_parallel_size > 1``.
A replica that dies or reports a fatal error raises ``ExecutorError`` (never a hang). Requests a replica
refuses come back as outputs with ``finish_reason=ERROR`` and the reason, instead of a ``ValueError``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

import msgspec

from octavo.core.engine_core_wire import ABORT, ADD, FATAL, OUTPUTS, READY, SHUTDOWN, UTILITY
from octavo.core.messages import EngineCoreOutputs, EngineCoreRequest, ModelInfo, SchedulerStats
from octavo.env_flags import env_float
from octavo.executor import ExecutorError

logger = logging.getLogger(__name__)

POLL_MS = 100
START_TIMEOUT_S = env_float("OCTAVO_WORKER_START_TIMEOUT", 900.0, minimum=0.0)
_BOOT = ("import json, sys; from octavo.core.engine_core_proc import run_engine_core; "
         "run_engine_core(*json.loads(sys.argv[1]))")


class DPEngineCore:
    def __init__(self, settings) -> None:
        import zmq

        self.settings = settings
        self.size = settings.parallel.data_parallel_size
        self._zmq = zmq
        self._enc = msgspec.msgpack.Encoder()
        self._out_dec = msgspec.msgpack.Decoder(EngineCoreOutputs)
        self._dir = tempfile.mkdtemp(prefix="octavo-dp-")
        self.ctx = zmq.Context()
        self.in_socks, self.out_socks, self.procs = [], [], []
        self.owner: dict[str, int] = {}  # request id -> replica
        self.stats: list[SchedulerStats] = [SchedulerStats() for _ in range(self.size)]
        self._closed = False
        child = settings.model_copy(update={"parallel": settings.parallel.model_copy(
            update={"data_parallel_size": 1})})
        child_json = json.dumps(child.model_dump(mode="json"))
        try:
            for i in range(self.size):
                ins, outs = self.ctx.socket(zmq.PUSH), self.ctx.socket(zmq.PULL)
                ins.setsockopt(zmq.LINGER, 0)
                ins.bind(f"ipc://{self._dir}/in{i}")
                outs.bind(f"ipc://{self._dir}/out{i}")
                self.in_socks.append(ins)
                self.out_socks.append(outs)
                args = [child_json, f"ipc://{self._dir}/in{i}", f"ipc://{self._dir}/out{i}", os.getpid()]
                self.procs.append(subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(args)]))
            infos = [self._wait_ready(i) for i in range(self.size)]
        except BaseException:
            self.shutdown()
            raise
        self.model_info: ModelInfo = infos[0]
        logger.info("data parallel: %d engine-core replicas (pids %s), %d KV blocks each",
                    self.size, [p.pid for p in self.procs], infos[0].num_kv_blocks)

    # ---- health ---------------------------------------------------------------------------------
    def check_health(self) -> None:
        if self._closed:
            raise ExecutorError("the data-parallel engine is shut down")
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                raise ExecutorError(f"data-parallel replica {i} (pid {p.pid}) exited with code {p.returncode}")

    def _wait_ready(self, i: int) -> ModelInfo:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.out_socks[i].poll(POLL_MS):
            self.check_health()
            if time.monotonic() > deadline:
                raise ExecutorError(f"data-parallel replica {i} did not start within {START_TIMEOUT_S:.0f} s")
        kind, payload = self.out_socks[i].recv_multipart()
        if kind == FATAL:
            raise ExecutorError(f"data-parallel replica {i}: {msgspec.msgpack.decode(payload)}")
        if kind != READY:
            raise ExecutorError(f"data-parallel replica {i} sent {kind!r} while starting")
        return msgspec.msgpack.decode(payload, type=ModelInfo)

    # ---- requests ---------------------------------------------------------------------------------
    def add_request(self, req: EngineCoreRequest) -> None:
        if req.request_id in self.owner:
            raise ValueError(f"request id {req.request_id!r} is already running; use a unique id.")
        load = [0] * self.size
        for i in self.owner.values():
            load[i] += 1
        i = min(range(self.size), key=load.__getitem__)
        self.owner[req.request_id] = i
        self.in_socks[i].send_multipart([ADD, self._enc.encode(req)])

    def abort_requests(self, request_ids: list[str]) -> list:
        by_replica: dict[int, list[str]] = {}
        for rid in request_ids:
            i = self.owner.pop(rid, None)
            if i is not None:
                by_replica.setdefault(i, []).append(rid)
        for i, ids in by_replica.items():
            self.in_socks[i].send_multipart([ABORT, self._enc.encode(ids)])
        return []

    def has_unfinished_requests(self) -> bool:
        return bool(self.owner)

    def get_stats(self) -> SchedulerStats:
        total = SchedulerStats()
        for s in self.stats:
            for f in s.__struct_fields__:
                a, b = getattr(total, f), getattr(s, f)
                if isinstance(a, list):  # per-position counters (spec_decode_accepted_per_pos): add elementwise
                    a, b = a + [0] * (len(b) - len(a)), b + [0] * (len(a) - len(b))
                    setattr(total, f, [x + y for x, y in zip(a, b)])
                else:
                    setattr(total, f, a + b)
        total.kv_cache_usage /= self.size
        return total

    def reset_prefix_cache(self) -> bool:
        raise ValueError("reset_prefix_cache is not supported with data_parallel_size > 1")

    # ---- the step ---------------------------------------------------------------------------------
    def step(self) -> EngineCoreOutputs:
        """Every output any replica has produced, waiting (health-checked) until there is at least one."""
        zmq = self._zmq
        poller = zmq.Poller()
        for s in self.out_socks:
            poller.register(s, zmq.POLLIN)
        while not poller.poll(POLL_MS):
            self.check_health()
        outputs = []
        for i, sock in enumerate(self.out_socks):
            while True:
                try:
                    kind, payload = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if kind == FATAL:
                    raise ExecutorError(f"data-parallel replica {i}: {msgspec.msgpack.decode(payload)}")
                if kind == UTILITY:
                    continue
                if kind == OUTPUTS:
                    out = self._out_dec.decode(payload)
                    if out.stats is not None:
                        self.stats[i] = out.stats
                    for o in out.outputs:
                        if o.finished:
                            self.owner.pop(o.request_id, None)
                    outputs.extend(out.outputs)
        return EngineCoreOutputs(outputs, self.get_stats(), time.monotonic())

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sock, p in zip(self.in_socks, self.procs):
            if p.poll() is None:
                try:
                    sock.send_multipart([SHUTDOWN, b""], self._zmq.NOBLOCK)
                except self._zmq.Again:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for s in [*self.in_socks, *self.out_socks]:
            s.close(linger=0)
        self.ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)
