"""The Ray executor: one Ray actor per rank, placed with a placement group, so one engine can span hosts.

    engine core ──ray.remote(StepBatch msgpack bytes)──▶ actor r (every rank)
    engine core ◀── rank 0's RunnerOutput msgpack bytes

Ray is an optional extra (``pip install octavo[ray]``). The engine joins the Ray cluster named by
``RAY_ADDRESS`` or, without one, starts a local Ray instance. Each rank asks for one GPU on GPU platforms
(one CPU on a CPU); the placement group packs the ranks (``PACK``: one host when it fits, else several).
Ranks join ``torch.distributed`` at rank 0's node address. Only bytes cross Ray: the step contract encoded
with msgpack, never a live object. A dead actor raises :class:`ExecutorError` at the next step or health
check.
"""

from __future__ import annotations

import logging
import os
import socket

import msgspec

from octavo.env_flags import env_float
from octavo.executor import Executor, ExecutorError, merge_worker_infos, resolve_target
from octavo.step import RunnerOutput, StepBatch, WorkerInfo

logger = logging.getLogger(__name__)

START_TIMEOUT_S = env_float("OCTAVO_WORKER_START_TIMEOUT", 900.0, minimum=0.0)


class RayWorkerActor:
    """The body of each rank's actor (wrapped with ``ray.remote`` when the executor starts)."""

    def __init__(self) -> None:
        self.worker = None
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(StepBatch)

    def node_address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port on it (rank 0's is the ``torch.distributed`` rendezvous)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def start(self, target: str, settings_json: str, rank: int, world_size: int, init_method: str) -> bytes:
        self.rank = rank
        self.worker = resolve_target(target)(settings_json, rank=rank, world_size=world_size,
                                             init_method=init_method)
        self.returns_output = getattr(self.worker, "returns_output", rank == 0)  # last stage's tp rank 0
        return self._enc.encode(self.worker.info())

    def ping(self) -> bool:
        return True

    def execute(self, batch: bytes) -> bytes | None:
        out = self.worker.execute(self._dec.decode(batch))
        return self._enc.encode(out) if self.returns_output else None


class RayExecutor(Executor):
    name = "ray"

    def __init__(self, settings, platform, worker_target: str) -> None:
        super().__init__(settings, platform, worker_target)
        try:
            import ray
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError as e:
            raise ValueError("distributed_executor_backend='ray' needs Ray: pip install 'octavo[ray]'") from e
        import json

        self._ray = ray
        self._closed, self.actors, self.pg = False, [], None
        par = settings.parallel
        self.world_size = par.tensor_parallel_size * par.pipeline_parallel_size
        self._started_ray = not ray.is_initialized()
        self._ray_env: dict = {}
        if self._started_ray:  # joins RAY_ADDRESS's cluster, or starts a local one (stopped at shutdown)
            # ray.init sets variables in this process's environment (RAY_CLIENT_MODE, RAY_AUTH_MODE, and
            # PYTHONBREAKPOINT, which would send the user's later breakpoint() to Ray's remote pdb): undone at shutdown
            before = dict(os.environ)
            ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=True)
            self._ray_env = {k: (before.get(k), v) for k, v in os.environ.items() if before.get(k) != v}
        resource = "CPU" if platform.device_type == "cpu" else "GPU"
        self.pg = placement_group([{resource: 1}] * self.world_size, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=START_TIMEOUT_S)
        except Exception as e:
            ray.util.remove_placement_group(self.pg)
            raise ExecutorError(f"Ray could not place {self.world_size} ranks with one {resource} each "
                                f"({ray.cluster_resources()}): {e}") from e
        actor_cls = ray.remote(RayWorkerActor)
        self.actors = [
            actor_cls.options(num_cpus=1 if resource == "CPU" else 0, num_gpus=1 if resource == "GPU" else 0,
                              scheduling_strategy=PlacementGroupSchedulingStrategy(
                                  placement_group=self.pg, placement_group_bundle_index=rank)).remote()
            for rank in range(self.world_size)]
        try:
            ip, port = ray.get(self.actors[0].node_address.remote(), timeout=START_TIMEOUT_S)
            settings_json = json.dumps(settings.model_dump(mode="json"))
            refs = [a.start.remote(worker_target, settings_json, rank, self.world_size, f"tcp://{ip}:{port}")
                    for rank, a in enumerate(self.actors)]
            dec = msgspec.msgpack.Decoder(WorkerInfo)
            infos = [dec.decode(b) for b in self._get(refs, START_TIMEOUT_S, "starting")]
        except BaseException:
            self.shutdown()
            raise
        self.worker_info = merge_worker_infos(infos)
        self._enc = msgspec.msgpack.Encoder()
        self._out_dec = msgspec.msgpack.Decoder(RunnerOutput)
        logger.info("ray executor: %d actors (tensor_parallel_size=%d x pipeline_parallel_size=%d) on %s, "
                    "rendezvous %s:%d; KV cache %d blocks per rank", self.world_size, par.tensor_parallel_size,
                    par.pipeline_parallel_size, resource, ip, port, self.worker_info.num_blocks)

    def _get(self, refs, timeout, what: str):
        ray = self._ray
        try:
            return ray.get(refs, timeout=timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError) as e:
            raise ExecutorError(f"a Ray worker failed while {what}: {e}") from e

    def execute(self, batch: StepBatch) -> RunnerOutput:
        if self._closed:
            raise ExecutorError("the ray executor is shut down")
        data = self._enc.encode(batch)
        refs = [a.execute.remote(data) for a in self.actors]
        try:
            outs = self._get(refs, None, "running a step")
        except ExecutorError:
            self.shutdown()
            raise
        return self._out_dec.decode(next(o for o in outs if o is not None))

    def check_health(self) -> None:
        """Ping every actor (they are idle between steps); a dead one raises."""
        if self._closed:
            raise ExecutorError("the ray executor is shut down")
        try:
            self._get([a.ping.remote() for a in self.actors], 60, "checking health")
        except ExecutorError:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self.pg is not None:
            try:
                ray.util.remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self._started_ray:
            ray.shutdown()
            _undo_environ(self._ray_env)


def _undo_environ(changes: dict) -> None:
    """Puts back each variable ``ray.init`` set ({key: (before or None, Ray's value)}), unless it changed since."""
    for key, (before, ray_value) in changes.items():
        if os.environ.get(key) != ray_value:
            continue  # set again by someone else since: theirs
        if before is None:
            del os.environ[key]
        else:
            os.environ[key] = before
