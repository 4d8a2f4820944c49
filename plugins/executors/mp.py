"""The multiprocess executor: one worker process per rank on this host, driven over ZeroMQ with msgpack.

    engine core ──PUSH in{r}──▶ worker r   (the same StepBatch bytes to every rank: encoded once)
    engine core ◀──PULL out─── worker 0   (RunnerOutput)   any rank: WorkerInfo once, or its fatal error

Async scheduling (``execute_async``): the step's bytes go out at once and a :class:`StepFuture` comes back;
rank 0's outputs arrive in step order, so the future of step k reads replies until the k-th is in. Each
worker resolves its deferred outputs on a reply thread while its main thread prepares the next step
(mp_worker.py), so the core's scheduling, the broadcast and the workers' input preparation of step N+1 all
overlap the device running step N. The sampled ids stay on the devices (broadcast from tp rank 0 there:
core/tp_comm.py), so the ranks never need the host's copy to feed step N+1.

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
from collections import deque

import msgspec

from octavo.env_flags import env_float
from octavo.executor import Executor, ExecutorError, merge_worker_infos
from octavo.step import RunnerOutput, StepBatch, WorkerInfo

logger = logging.getLogger(__name__)

INFO, OUTPUT, ERROR, SHUTDOWN, STEP = b"I", b"O", b"E", b"S", b"B"
RPC, RPC_RESULT = b"C", b"R"  # collective_rpc: {"method", "args", "kwargs"} to every rank; {"result"|"error"} back
POLL_MS = 100
START_TIMEOUT_S = env_float("OCTAVO_WORKER_START_TIMEOUT", 900.0, minimum=0.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StepFuture:
    """Rank 0's answer to one step sent by :meth:`MultiprocExecutor.execute_async` (``result()`` waits)."""

    def __init__(self, executor: MultiprocExecutor, seq: int) -> None:
        self._executor, self._seq = executor, seq
        self._out: RunnerOutput | None = None

    def result(self) -> RunnerOutput:
        if self._out is None:
            self._out = self._executor._await(self._seq)
        return self._out


class MultiprocExecutor(Executor):
    name = "mp"
    supports_async_scheduling = True

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
        # async scheduling: steps submitted / sent / answered so far; replies that came before they were asked
        # for; steps held back until their grammar bitmasks can be filled (see ``_flush``)
        self._submitted = self._sent = self._answered = 0
        self._replies: dict[int, bytes] = {}
        self._held: deque = deque()
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
        return self.execute_async(batch).result()

    def execute_async(self, batch: StepBatch, grammar=None) -> StepFuture:
        """Send the step now (or, with a grammar, as soon as its bitmasks can be filled) and return its future.
        Steps run on the workers in submission order; the core waits on a future only for that step."""
        self.check_health()
        fut = StepFuture(self, self._submitted)
        self._submitted += 1
        self._held.append((batch, grammar))
        self._flush(upto=None)
        return fut

    def _flush(self, upto: int | None) -> None:
        """Send held steps in order. A structured step's bitmasks need the previous step's tokens in the
        grammars: under async scheduling the engine core releases its gate once they are (``is_released``), so
        a step whose gate is still closed holds back itself and every later step, unless the core now waits
        for it (``upto``): by then the core has released it. The fill then runs here, before the send, so
        such a step does not overlap the previous one on the workers (the in-process executor overlaps it)."""
        while self._held:
            batch, grammar = self._held[0]
            if grammar is not None:
                ready = getattr(grammar, "is_released", None)  # a plain GrammarStep (no gate) is always ready
                if ready is not None and not ready():
                    if upto is None or self._sent > upto:
                        return
                    raise RuntimeError(f"step {self._sent} is awaited but its grammar gate is still closed (the "
                                       "engine core releases it before waiting): filling it would never end")
                _attach_bitmasks(grammar, batch)
            self._held.popleft()
            self._broadcast([STEP, self._enc.encode(batch)])
            self._sent += 1

    def _await(self, seq: int) -> RunnerOutput:
        """Rank 0's output of step ``seq`` (outputs come in step order)."""
        try:
            if self._sent <= seq:
                self._flush(upto=seq)
            while self._answered <= seq:
                kind, rank, payload = self._recv(None, "running a step")
                if kind == OUTPUT:
                    self._replies[self._answered] = payload
                    self._answered += 1
            return self._out_dec.decode(self._replies.pop(seq))
        except ExecutorError:
            self.shutdown()  # survivors may be stuck in a collective with the dead rank
            raise

    def collective_rpc(self, method, args=(), kwargs=None, timeout=None) -> list:
        """Every rank runs ``worker.rpc(method, args, kwargs)``; results by rank. Only names cross the process
        boundary (a worker method or ``"module:function"``): nothing is pickled, so a callable is refused."""
        if self._answered < self._submitted:  # the engine core waits idle first; a reply must not be skipped
            raise ExecutorError(f"collective_rpc({method!r}) while {self._submitted - self._answered} step(s) "
                                "are unanswered")
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


def _attach_bitmasks(grammar, batch: StepBatch) -> None:
    """Fill the step's grammar bitmasks now and put each masked row into its ``ScheduledRequestData`` as
    bytes (``GrammarStep.attach``; a gated step's ``wait()`` gives the same rows once released)."""
    _, positions, rows = grammar.wait()
    if rows is None or not positions:
        return
    data = rows.numpy()
    for j, i in enumerate(positions):
        batch.scheduled[i].grammar_bitmask = data[j].tobytes()
