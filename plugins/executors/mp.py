"""The multiprocess executor: one worker process per rank on this host, driven over ZeroMQ with msgpack.

    engine core ──PUSH in{r}──▶ worker r   (the same StepBatch bytes to every rank: encoded once)
    engine core ◀──PULL out─── worker 0   (RunnerOutput)   any rank: WorkerInfo once, or its fatal error

Workers are fresh interpreters (``python -m octavo.plugins.executors.mp_worker``: spawn semantics; the
engine core is itself a daemonic process, which ``multiprocessing`` forbids to have children). The ranks
join ``torch.distributed`` (the platform's backend) among themselves; the engine core is not a rank.

Failure: while waiting for a worker, the executor polls every 100 ms and checks every process; a dead one,
or an error message from any rank, raises :class:`ExecutorError` (the surviving ranks, possibly stuck in a
collective, are killed). Sends never block on a dead peer. Workers exit when the engine core's process is
gone. Nothing is pickled: every message is a msgspec struct or a string.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import msgspec

from octavo.executor import Executor, ExecutorError, merge_worker_infos
from octavo.step import RunnerOutput, StepBatch, WorkerInfo

logger = logging.getLogger(__name__)

INFO, OUTPUT, ERROR, SHUTDOWN, STEP = b"I", b"O", b"E", b"S", b"B"
RPC, RPC_RESULT = b"C", b"R"  # collective_rpc: {"method", "args", "kwargs"} to every rank; {"result"|"error"} back
POLL_MS = 100
START_TIMEOUT_S = float(os.environ.get("OCTAVO_WORKER_START_TIMEOUT", "900"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MultiprocExecutor(Executor):
    name = "mp"

    def __init__(self, settings, platform, worker_target: str) -> None:
        super().__init__(settings, platform, worker_target)
        import zmq

        par = settings.parallel
        self.world_size = par.tensor_parallel_size * par.pipeline_parallel_size
        self._zmq = zmq
        self._enc = msgspec.msgpack.Encoder()
        self._out_dec = msgspec.msgpack.Decoder(RunnerOutput)
        self._info_dec = msgspec.msgpack.Decoder(WorkerInfo)
        self.procs: list[subprocess.Popen] = []
        self.in_socks = []
        self._closed = False
        self._dir = tempfile.mkdtemp(prefix="octavo-mp-")
        self.ctx = zmq.Context()
        self.out_sock = self.ctx.socket(zmq.PULL)
        self.out_sock.bind(f"ipc://{self._dir}/out")
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        settings_json = json.dumps(settings.model_dump(mode="json"))
        try:
            for rank in range(self.world_size):
                sock = self.ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.bind(f"ipc://{self._dir}/in{rank}")
                self.in_socks.append(sock)
                args = {"target": worker_target, "settings": settings_json, "rank": rank,
                        "world_size": self.world_size, "init_method": init_method,
                        "in_addr": f"ipc://{self._dir}/in{rank}", "out_addr": f"ipc://{self._dir}/out",
                        "parent_pid": os.getpid()}
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "octavo.plugins.executors.mp_worker", json.dumps(args)]))
            infos: dict[int, WorkerInfo] = {}
            deadline = time.monotonic() + START_TIMEOUT_S
            while len(infos) < self.world_size:
                kind, rank, payload = self._recv(deadline, "starting")
                if kind != INFO:
                    raise ExecutorError(f"worker rank {rank} sent {kind!r} while starting")
                infos[rank] = self._info_dec.decode(payload)
        except BaseException:
            self.shutdown()
            raise
        self.worker_info = merge_worker_infos([infos[r] for r in range(self.world_size)])
        logger.info("mp executor: %d worker processes (pids %s), tensor_parallel_size=%d x pipeline_parallel_size="
                    "%d, %s on %s; KV cache %d blocks per rank", self.world_size, [p.pid for p in self.procs],
                    par.tensor_parallel_size, par.pipeline_parallel_size, platform.distributed_backend,
                    self.worker_info.device, self.worker_info.num_blocks)

    # ---- health -----------------------------------------------------------------------------------
    def check_health(self) -> None:
        if self._closed:
            raise ExecutorError("the mp executor is shut down")
        for rank, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None:
                raise ExecutorError(f"worker rank {rank} (pid {proc.pid}) exited with code {code}; the engine "
                                    "cannot continue without it")

    def _recv(self, deadline: float | None, what: str) -> tuple[bytes, int, bytes]:
        """The next message from any worker, checking every process while waiting (never hangs)."""
        while not self.out_sock.poll(POLL_MS):
            self.check_health()
            if deadline is not None and time.monotonic() > deadline:
                raise ExecutorError(f"workers did not answer within {START_TIMEOUT_S:.0f} s while {what} "
                                    "(OCTAVO_WORKER_START_TIMEOUT)")
        kind, rank, payload = self.out_sock.recv_multipart()
        if kind == ERROR:
            raise ExecutorError(f"worker rank {int(rank)} failed: {payload.decode(errors='replace')}")
        return kind, int(rank), payload

    # ---- steps ------------------------------------------------------------------------------------
    def _broadcast(self, frames: list[bytes]) -> None:
        zmq = self._zmq
        for sock in self.in_socks:
            while True:
                try:
                    sock.send_multipart(frames, zmq.NOBLOCK)
                    break
                except zmq.Again:  # no peer (it died) or its queue is full: check, then retry
                    self.check_health()
                    time.sleep(POLL_MS / 1000)

    def execute(self, batch: StepBatch) -> RunnerOutput:
        self.check_health()
        self._broadcast([STEP, self._enc.encode(batch)])
        try:
            while True:
                kind, rank, payload = self._recv(None, "running a step")
                if kind == OUTPUT:
                    return self._out_dec.decode(payload)
        except ExecutorError:
            self.shutdown()  # survivors may be stuck in a collective with the dead rank
            raise

    def collective_rpc(self, method, args=(), kwargs=None, timeout=None) -> list:
        """Every rank runs ``worker.rpc(method, args, kwargs)``; results by rank. Only names cross the process
        boundary (a worker method or ``"module:function"``): nothing is pickled, so a callable is refused."""
        if not isinstance(method, str):
            raise TypeError("collective_rpc with worker processes takes a method name or 'module:function' (octavo "
                            f"sends no pickled code), got {type(method).__name__}.")
        self.check_health()
        self._broadcast([RPC, self._enc.encode({"method": method, "args": list(args), "kwargs": dict(kwargs or {})})])
        deadline = time.monotonic() + timeout if timeout else None
        replies: dict[int, dict] = {}
        while len(replies) < self.world_size:
            kind, rank, payload = self._recv(deadline, f"running collective_rpc({method!r})")
            if kind == RPC_RESULT:
                replies[rank] = msgspec.msgpack.decode(payload)
        failed = [(r, rep["error"]) for r, rep in sorted(replies.items()) if "error" in rep]
        if failed:
            raise RuntimeError(f"collective_rpc({method!r}) failed on rank {failed[0][0]}: {failed[0][1]}")
        return [replies[r]["result"] for r in range(self.world_size)]

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for rank, sock in enumerate(self.in_socks):
            if self.procs[rank].poll() is None:
                try:
                    sock.send_multipart([SHUTDOWN, b""], self._zmq.NOBLOCK)
                except self._zmq.Again:
                    pass
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for sock in [*self.in_socks, self.out_sock]:
            sock.close(linger=0)
        self.ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)
