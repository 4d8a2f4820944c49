"""The process of one ``mp`` rank: build the worker, report its ``WorkerInfo``, then run every step it is
sent; rank 0 returns each step's output. Any failure is reported (with its traceback) and ends the process
with code 1; the process also ends when the engine core's process is gone.

Run as ``python -m octavo.plugins.executors.mp_worker '<json args>'`` by :mod:`.mp`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import traceback

import msgspec

from octavo.executor import resolve_target
from octavo.plugins.executors.mp import ERROR, INFO, OUTPUT, RPC, RPC_RESULT, SHUTDOWN
from octavo.step import StepBatch

PARENT_CHECK_MS = 1000


def main(args: dict) -> int:
    import zmq

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine core decides when we stop
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s [rank {args['rank']}] %(name)s: "
                        "%(message)s")
    rank = args["rank"]
    ctx = zmq.Context()
    in_sock = ctx.socket(zmq.PULL)
    in_sock.connect(args["in_addr"])
    out_sock = ctx.socket(zmq.PUSH)
    out_sock.setsockopt(zmq.LINGER, 2000)  # let a last error message reach the engine core
    out_sock.connect(args["out_addr"])
    tag = str(rank).encode()
    enc = msgspec.msgpack.Encoder()
    dec = msgspec.msgpack.Decoder(StepBatch)
    try:
        worker = resolve_target(args["target"])(args["settings"], rank=rank, world_size=args["world_size"],
                                                init_method=args["init_method"])
        out_sock.send_multipart([INFO, tag, enc.encode(worker.info())])
        returns_output = getattr(worker, "returns_output", rank == 0)
        while True:
            if not in_sock.poll(PARENT_CHECK_MS):
                if os.getppid() != args["parent_pid"]:
                    return 0  # orphaned: the engine core is gone
                continue
            kind, payload = in_sock.recv_multipart()
            if kind == SHUTDOWN:
                return 0
            if kind == RPC:  # collective_rpc: a failure is this call's answer, not the worker's end
                call = msgspec.msgpack.decode(payload)
                try:
                    reply = enc.encode({"result": worker.rpc(call["method"], call["args"], call["kwargs"])})
                except Exception as e:  # noqa: BLE001 - reported to the caller of collective_rpc
                    reply = enc.encode({"error": f"{type(e).__name__}: {e}"})
                out_sock.send_multipart([RPC_RESULT, tag, reply])
                continue
            out = worker.execute(dec.decode(payload))
            if returns_output:  # tp rank 0 of the last pipeline stage
                out_sock.send_multipart([OUTPUT, tag, enc.encode(out)])
    except BaseException as e:  # noqa: BLE001 - reported to the engine core, which fails cleanly
        if isinstance(e, SystemExit) and not e.code:
            return 0
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        out_sock.send_multipart([ERROR, tag, f"{type(e).__name__}: {e}\n{text}".encode()])
        return 1
    finally:
        in_sock.close(linger=0)
        out_sock.close()
        ctx.term()


if __name__ == "__main__":
    code = main(json.loads(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip torch's interpreter teardown (and any collective left hanging)
