"""The process of one ``mp`` rank: build the worker, report its ``WorkerInfo``, then run every step it is
sent; rank 0 returns each step's output (under async scheduling through a reply thread, mp_replies.py, so
this thread prepares the next step meanwhile). Any failure is reported (with its traceback) and ends the process
with code 1; the process also ends when the engine core's process is gone.

Run as ``python -m octavo.plugins.executors.mp_worker '<json args>'`` by :mod:`.mp`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys

import msgspec

from octavo.executor import resolve_target
from octavo.plugins.executors.mp import INFO, RPC, RPC_RESULT, SHUTDOWN
from octavo.plugins.executors.mp_replies import Replies, error_frames
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
    replies = None
    try:
        worker = resolve_target(args["target"])(args["settings"], rank=rank, world_size=args["world_size"],
                                                init_method=args["init_method"])
        out_sock.send_multipart([INFO, tag, enc.encode(worker.info())])
        # tp rank 0 of the last pipeline stage answers; deferred (async) outputs on a reply thread (mp_replies.py)
        replies = Replies(out_sock, tag, getattr(worker, "returns_output", rank == 0), _device_binder(worker))
        while True:
            if not in_sock.poll(PARENT_CHECK_MS):
                replies.check()
                if os.getppid() != args["parent_pid"]:
                    return 0  # orphaned: the engine core is gone
                continue
            kind, payload = in_sock.recv_multipart()
            if kind == SHUTDOWN:
                return 0
            if kind == RPC:  # collective_rpc: a failure is this call's answer, not the worker's end
                replies.drain()
                call = msgspec.msgpack.decode(payload)
                try:
                    reply = enc.encode({"result": worker.rpc(call["method"], call["args"], call["kwargs"])})
                except Exception as e:  # noqa: BLE001 - reported to the caller of collective_rpc
                    reply = enc.encode({"error": f"{type(e).__name__}: {e}"})
                replies.send([RPC_RESULT, tag, reply])
                continue
            replies.output(worker.execute(dec.decode(payload)))
    except BaseException as e:  # noqa: BLE001 - reported to the engine core, which fails cleanly
        if isinstance(e, SystemExit) and not e.code:
            return 0
        frames = error_frames(tag, e)
        if replies is not None:
            replies.send(frames)
        else:
            out_sock.send_multipart(frames)
        return 1
    finally:
        if replies is not None:
            replies.close()
        in_sock.close(linger=0)
        out_sock.close()
        ctx.term()


def _device_binder(worker):
    """The reply thread's device: CUDA's current device is per thread."""
    device = getattr(worker, "device", None)
    if device is None or device.type != "cuda":
        return None

    def bind():
        import torch

        torch.cuda.set_device(device)

    return bind


if __name__ == "__main__":
    code = main(json.loads(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip torch's interpreter teardown (and any collective left hanging)
