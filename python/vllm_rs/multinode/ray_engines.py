"""`serve --data-parallel-backend ray`: engine cores as Ray actors, the role
of vLLM's `CoreEngineActorManager`, with the process managers' interface
(`monitor_engine_liveness`, `shutdown`, `failed_proc_name`, `sentinels`).

Every rank gets a placement group of one bundle, `{"CPU": 1}` plus a sliver
of the `node:IP` resource of the node it must run on: ranks
`0 .. --data-parallel-size-local` on the head node (the node whose address is
`--data-parallel-address`), the others on the other alive nodes in turn, as
many per node as it has CPUs. The actors connect to the frontends' TCP
engine sockets on the head like any engine. They die with the manager:
Ray kills an actor whose owner (this process) dies, and `shutdown()` kills
them explicitly and removes their placement groups.

Ray is needed by this module only: `pip install 'vllm-rs[ray]'`."""

from __future__ import annotations

import os
import threading
from typing import Any

from vllm_rs.engine.config import EngineConfig
from vllm_rs.logger import init_logger
from vllm_rs.multinode.topology import Topology

logger = init_logger("vllm_rs.multinode.ray_engines")

#: How long placement groups and the actors' start may take.
PLACEMENT_TIMEOUT_S = 120.0
#: Environment passed on to the actors (logging, thread counts).
FORWARDED_ENV_PREFIXES = ("VLLM_", "OMP_NUM_THREADS")


class EngineCoreActor:
    """One engine core in a Ray worker process: `run()` serves until the
    actor is killed; an engine failure tells the frontends (ENGINE_CORE_DEAD)
    and ends the call with the error."""

    def __init__(self, config: EngineConfig, dp_rank: int):
        self.config = config
        self.dp_rank = dp_rank

    def pid(self) -> int:
        """The worker process's pid (for logs and tests)."""
        return os.getpid()

    def run(self) -> None:
        """Loads the model, registers with the frontends and serves."""
        from vllm_rs.engine.core_proc import DEAD_MESSAGE_LINGER_MS, EngineCoreProc

        proc = EngineCoreProc(self.config, self.dp_rank)
        try:
            proc.run()
        except BaseException:
            logger.exception("EngineCore_%d failed", self.dp_rank)
            proc.send_dead()
            proc.close(linger=DEAD_MESSAGE_LINGER_MS)
            raise


def _node_ip(node: dict[str, Any]) -> str:
    return str(node["NodeManagerAddress"])


def plan_placement(nodes: list[dict[str, Any]], topology: Topology) -> list[str]:
    """The node address for each rank: `local_count` on the head node, the
    rest on the other alive nodes, filling each up to its CPU count.
    RuntimeError when the cluster cannot hold them."""
    alive = [n for n in nodes if n.get("Alive")]
    head = [n for n in alive if _node_ip(n) == topology.address]
    if not head:
        raise RuntimeError(
            f"no alive Ray node has the address {topology.address} (--data-parallel-address); "
            f"the cluster's nodes: {sorted(_node_ip(n) for n in alive)}"
        )
    placement = [topology.address] * topology.local_count
    for node in (n for n in alive if n is not head[0]):
        room = int(node.get("Resources", {}).get("CPU", 0))
        placement += [_node_ip(node)] * min(room, topology.data_parallel_size - len(placement))
    if len(placement) < topology.data_parallel_size:
        raise RuntimeError(
            f"the Ray cluster has room for {len(placement)} of {topology.data_parallel_size} engines "
            f"({topology.local_count} on the head node, one per CPU elsewhere)"
        )
    return placement


class RayEngineActorManager:
    """Places and starts `topology.data_parallel_size` engine actors and
    watches them; see the module docstring."""

    def __init__(self, config: EngineConfig, topology: Topology, log_stats: bool):
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.failed_proc_name: str | None = None
        self.manager_stopped = threading.Event()
        self.actors: list[Any] = []
        self.placement_groups: list[Any] = []
        self._run_refs: dict[Any, int] = {}
        self._remove_placement_group = remove_placement_group
        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, logging_level="WARNING")
        config.log_stats = log_stats
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
        try:
            placement = plan_placement(ray.nodes(), topology)
            for ip in placement:
                group = placement_group([{"CPU": 1, f"node:{ip}": 0.001}], strategy="STRICT_PACK")
                self.placement_groups.append(group)
            ray.get([g.ready() for g in self.placement_groups], timeout=PLACEMENT_TIMEOUT_S)
            actor_class = ray.remote(EngineCoreActor)
            for rank, group in enumerate(self.placement_groups):
                actor = actor_class.options(
                    num_cpus=1,
                    max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
                    runtime_env={"env_vars": env},
                ).remote(config, rank)
                self.actors.append(actor)
            pids = ray.get([a.pid.remote() for a in self.actors], timeout=PLACEMENT_TIMEOUT_S)
            for rank, (actor, ip, pid) in enumerate(zip(self.actors, placement, pids)):
                logger.info("EngineCore_%d: Ray actor on node %s (pid %d)", rank, ip, pid)
                self._run_refs[actor.run.remote()] = rank
        except BaseException:
            self.shutdown()
            raise

    def sentinels(self) -> list[int]:
        """No process of this host to wait on: `monitor_engine_liveness` watches."""
        return []

    def monitor_engine_liveness(self) -> None:
        """Blocks until an actor ends (then `failed_proc_name` names its rank:
        an engine actor only ends by dying) or the manager stops."""
        import ray

        while not self.manager_stopped.is_set():
            done, _ = ray.wait(list(self._run_refs), num_returns=1, timeout=1.0)
            if not done or self.manager_stopped.is_set():
                continue
            rank = self._run_refs[done[0]]
            try:
                ray.get(done[0])
                why = "returned"
            except Exception as e:  # RayActorError, RayTaskError: the actor's end
                why = type(e).__name__
            self.failed_proc_name = f"EngineCore_{rank} (Ray actor, {why})"
            return

    def shutdown(self, timeout: float | None = None) -> None:
        """Kills every actor and removes the placement groups; idempotent."""
        import ray

        if self.manager_stopped.is_set() and not self.actors:
            return
        self.manager_stopped.set()
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as e:  # already gone
                logger.debug("killing an engine actor: %s", e)
        self.actors = []
        for group in self.placement_groups:
            try:
                self._remove_placement_group(group)
            except Exception as e:
                logger.debug("removing a placement group: %s", e)
        self.placement_groups = []
