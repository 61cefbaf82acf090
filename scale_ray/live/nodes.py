"""The live scheduler's servers: the node set read from Ray and, with ``executor=actor``, the
server actors.

Every server node (``scale_ray.live.discovery``: nodes with ``scale_*`` resources, else every
node from what Ray reports) hosts ``scale_slot`` servers (or ``slots_per_node``, or one per
``task_num_cpus`` CPUs), each running one primitive at a time. :meth:`NodeSet.refresh` reads
``ray.nodes()`` (at most every
``node_refresh_s``): a node that appears is added, one that disappears (dead, removed) is marked
dead and never chosen again; what ran there is the scheduler's to place again.

With ``executor=actor`` a server's actor is started when the server appears (the server is offered
to the policy once the actor answers), started again after a failure (a failed start is retried,
still masked, after ``ACTOR_RETRY_S``: a dying node fails every start until the GCS drops it), and
killed after ``actor_idle_s`` idle so that the node's CPU is free for the autoscaler. A reaped
server is masked; it is started again, masked until its actor answers, once tasks wait for a
server (:meth:`NodeSet.wake`): a run handed to a server whose actor is still starting took 1-2 s
wall longer than the scheduler expected (results/live_twin/README.md).
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from envs.config import TierConfig

from .cluster import NodeInfo
from .config import LiveConfig, resolved_model
from .discovery import discover
from .executors import RemoteCache
from .ray_cpu import RayCalls
from .workflow import Primitive

if TYPE_CHECKING:
    from .tasks import LiveTask

log = logging.getLogger(__name__)

ACTOR_RETRY_S = 1.0  # pause before starting a server's actor again after a failed start


class LiveServer:
    """One server: slot ``slot`` of a node, running one primitive at a time; or, in Ray's
    resource model (``LiveConfig.model: nodes``), the whole node, running every task that fits.
    ``running``: its runs and their expected ends (wall s)."""
    __slots__ = ("sid", "node", "slot", "running", "busy_until", "alive", "actor", "bodies",
                 "idle_since", "probe", "offered", "retry_at")

    def __init__(self, sid: int, node: NodeInfo, slot: int):
        self.sid = sid
        self.node = node
        self.slot = slot
        self.running: dict[LiveTask, float] = {}
        self.busy_until = 0.0
        self.alive = True
        self.actor: Any = None          # executor=actor: this server's actor (None: not started)
        self.bodies: set[int] = set()   # primitive bodies registered with that actor
        self.idle_since = 0.0
        self.probe: Any = None          # readiness ref of a starting actor
        self.offered = True             # unmasked for the policy (False while its actor starts)
        self.retry_at = 0.0             # a failed actor start is retried from then on

    @property
    def task(self) -> LiveTask | None:
        """A task running here (the only one in the slot model), None when idle."""
        return next(iter(self.running), None)

    def take(self, t: LiveTask, until: float) -> None:
        """A run of ``t`` starts here, expected to end at wall time ``until``."""
        self.running[t] = until
        self.busy_until = until

    def release(self, t: LiveTask, now: float) -> bool:
        """``t``'s run here ended (or was stopped); False when it was not running here."""
        if self.running.pop(t, None) is None:
            return False
        if not self.running:
            self.idle_since = now
        return True


class NodeSet:
    """The servers of the live node set, keyed by (node id, slot), and their actors.

    ``counters`` is the scheduler's (``node_refreshes``, ``actors_started``, ``actors_reaped``);
    ``on_offered(server, offered)`` is called when a server is masked while its actor starts and
    offered again once it answers.
    """

    def __init__(self, cfg: LiveConfig, tiers: Sequence[TierConfig], remote: RemoteCache,
                 counters: dict[str, Any], on_offered: Callable[[LiveServer, bool], None]):
        self.cfg = cfg
        self.tiers = tiers
        self.remote = remote
        self.counters = counters
        self._ray_calls = RayCalls(counters)
        self.actors = cfg.executor == "actor"
        self._on_offered = on_offered
        self.servers: dict[tuple[str, int], LiveServer] = {}
        self.probes: dict[Any, LiveServer] = {}
        self.cold: list[LiveServer] = []  # failed actor starts, retried after a pause
        self.reaped: list[LiveServer] = []  # actors killed idle, masked until woken
        self._next_sid = 0
        self._last_refresh = -math.inf
        self._last_reap = 0.0
        self.source: str | None = None  # where the servers come from (discovery: scale or ray)
        #: the servers are slots (one task each) or whole Ray nodes (LiveConfig.model): set by
        #: the first refresh
        self.slotted = True

    def alive(self) -> list[LiveServer]:
        """The servers still alive, in the order they appeared."""
        return [s for s in self.servers.values() if s.alive]

    def refresh(self, force: bool = False) -> tuple[list[LiveServer], list[LiveServer]] | None:
        """Read the node set (at most every ``node_refresh_s`` unless ``force``; None when not
        due): the servers added (their actors starting, masked) and the servers gone (marked
        dead, their actors and pinned functions dropped; a task still on one is the caller's)."""
        now = time.perf_counter()
        if not force and now - self._last_refresh < self.cfg.node_refresh_s:
            return None
        self._last_refresh = now
        self.counters["node_refreshes"] += 1
        import ray

        with self._ray_calls:  # the GCS call; the parsing is the scheduler's own work
            raw = ray.nodes()
        nodes, source = discover(raw, self.tiers, self.cfg)
        if source != self.source:
            log.info("live scheduler: servers from %s (%d nodes, %d servers)", "the nodes' scale_* "
                     "resources" if source == "scale" else "what Ray reports of every node",
                     len(nodes), sum(self.cfg.slots_per_node or n.slots for n in nodes))
            self.source = source
            self.slotted = not (source == "ray" and resolved_model(self.cfg, source) == "nodes")
            # on whole nodes each task is its own Ray task with its own demands
            self.actors = self.cfg.executor == "actor" and self.slotted
        alive_ids = {n.node_id for n in nodes}
        added: list[LiveServer] = []
        gone: list[LiveServer] = []
        for n in nodes:
            slots = self.cfg.slots_per_node or n.slots if self.slotted else 1
            for s in range(slots):
                if (n.node_id, s) not in self.servers:
                    srv = LiveServer(self._next_sid, n, s)
                    self._next_sid += 1
                    self.servers[(n.node_id, s)] = srv
                    if self.actors:  # start its actor now; offered once it is ready
                        self.start_actor(srv, probe=True)
                    added.append(srv)
        for srv in self.servers.values():
            if srv.alive and srv.node.node_id not in alive_ids:
                srv.alive = False
                self.remote.forget_node(srv.node.node_id)
                self.drop_actor(srv)
                gone.append(srv)
        return added, gone

    def run(self, srv: LiveServer, prim: Primitive, meta: tuple, args: Sequence[Any],
            kwargs: dict[str, Any]) -> tuple[Any, Any]:
        """Run ``prim`` on ``srv``: a call of its actor (started now if it was reaped; the body
        registered once per actor), or a Ray task pinned to its node (always for a primitive
        with Ray options: :meth:`~scale_ray.live.executors.RemoteCache.ray_task_options`). ``meta`` as
        :func:`~scale_ray.live.executors.wrap_body`. Returns (value ref, status ref)."""
        if not self.slotted:  # a whole node: its Ray task asks Ray for what it demands
            opts = self.remote.node_task_options(prim)
            rf = self.remote.pinned(prim.fn, srv.node.node_id, prim.name, opts)
            return rf.remote(meta, *args, **kwargs)
        if prim.ray_options:  # GPUs, resources, runtime env: its own Ray task asks Ray for them
            opts = self.remote.ray_task_options(prim.ray_options, self.actors)
            rf = self.remote.pinned(prim.fn, srv.node.node_id, prim.name, opts)
            return rf.remote(meta, *args, **kwargs)
        if self.actors:
            actor = srv.actor if srv.actor is not None else self.start_actor(srv)
            key, body = self.remote.body(prim.fn)
            if key not in srv.bodies:  # actor calls of one caller run in order: no wait needed
                actor.register.remote(key, body)
                srv.bodies.add(key)
            return actor.run.remote(key, meta, *args, **kwargs)
        rf = self.remote.pinned(prim.fn, srv.node.node_id, prim.name)
        return rf.remote(meta, *args, **kwargs)

    # ------------------------------------------------------------------ server actors
    def start_actor(self, srv: LiveServer, probe: bool = False) -> Any:
        """Start ``srv``'s actor. With ``probe`` the server is not offered to the policy until the
        actor answers (a new node, or a restart after a failure: the node may be dying while
        the GCS still lists it); without, runs queue behind the actor's start."""
        srv.actor = self.remote.actor(srv.node.node_id)
        srv.bodies = set()
        srv.idle_since = time.perf_counter()
        self.counters["actors_started"] += 1
        if probe:
            srv.probe = srv.actor.__ray_ready__.remote()
            self.probes[srv.probe] = srv
            self._on_offered(srv, False)
        return srv.actor

    def retry_cold(self) -> None:
        """Start again, masked, the actors whose failed start's pause is over."""
        now = time.perf_counter()
        due = [srv for srv in self.cold if now >= srv.retry_at]
        if not due:
            return
        self.cold = [srv for srv in self.cold if now < srv.retry_at]
        for srv in due:
            if srv.alive and srv.actor is None:
                self.start_actor(srv, probe=True)

    def check_probes(self, ray: Any) -> list[LiveServer]:
        """Servers whose starting actor answered are offered again; returns those whose actor
        failed to start (the caller refreshes the node set, then :meth:`back_off`)."""
        done, _ = ray.wait(list(self.probes), num_returns=len(self.probes), timeout=0,
                           fetch_local=False)
        failed = []
        for ref in done:
            srv = self.probes.pop(ref)
            if srv.probe is not ref:
                continue
            srv.probe = None
            try:
                ray.get(ref)
                self._on_offered(srv, True)
                srv.idle_since = time.perf_counter()  # the reaper counts from here
            except Exception as e:
                log.info("actor of server %d on node %s failed to start: %s", srv.sid,
                         srv.node.node_id[:12], type(e).__name__)
                srv.actor = None  # it never started; nothing to kill
                failed.append(srv)
        return failed

    def back_off(self, failed: Sequence[LiveServer]) -> None:
        """Retry, after ``ACTOR_RETRY_S``, the failed actor starts of servers still alive."""
        retry_at = time.perf_counter() + ACTOR_RETRY_S
        for srv in failed:
            if srv.alive and srv.actor is None:
                srv.retry_at = retry_at
                self.cold.append(srv)

    def drop_actor(self, srv: LiveServer) -> None:
        """Kill ``srv``'s actor (its masking, if starting, is left to the caller)."""
        if srv.probe is not None:
            self.probes.pop(srv.probe, None)
            srv.probe = None
        if srv.actor is None:
            return
        import ray

        actor, srv.actor = srv.actor, None
        srv.bodies = set()
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already dead with its node
            pass

    def stop_actors(self, timeout_s: float = 30.0) -> None:
        """Kill every server actor and wait (at most ``timeout_s``) until Ray reports them dead
        (their CPUs come back shortly after that, asynchronously)."""
        actors = [srv.actor for srv in self.servers.values() if srv.actor is not None]
        for srv in self.servers.values():
            self.drop_actor(srv)
        if not actors:
            return
        import ray

        probes = []
        for a in actors:
            try:
                probes.append(a.__ray_ready__.remote())
            except Exception:
                pass
        if probes:  # each fails once its actor is dead
            ray.wait(probes, num_returns=len(probes), timeout=timeout_s, fetch_local=False)

    def reap(self, alive: Sequence[LiveServer]) -> None:
        """Kill actors of servers idle for ``actor_idle_s``: an actor holds its CPU, and a node
        whose resources are in use is never idle to the autoscaler. Checked about once a second."""
        now = time.perf_counter()
        if now - self._last_reap < min(1.0, self.cfg.actor_idle_s):
            return
        self._last_reap = now
        for srv in alive:
            # an actor still starting is not idle: killing it would offer the server untested
            if srv.actor is not None and srv.task is None and srv.offered \
                    and now - srv.idle_since >= self.cfg.actor_idle_s:
                self.drop_actor(srv)
                self._on_offered(srv, False)
                self.reaped.append(srv)
                self.counters["actors_reaped"] += 1

    def wake(self, needs_gb: Sequence[float], alive: Sequence[LiveServer]) -> None:
        """Ready tasks wait, needing ``needs_gb`` of memory each: unless an offered server that
        fits the smallest need is idle (then they wait by choice), start again, masked until
        they answer, the actors of up to that many reaped servers that fit it, the fastest
        first (a server that fits none stays reaped)."""
        self.reaped = [srv for srv in self.reaped if srv.alive and srv.actor is None]
        if not needs_gb:
            return
        least = min(needs_gb)
        if any(srv.offered and srv.task is None and srv.node.memory_gb >= least for srv in alive):
            return
        fit = sorted((srv for srv in self.reaped if srv.node.memory_gb >= least),
                     key=lambda srv: -srv.node.compute)[:len(needs_gb)]
        for srv in fit:
            self.reaped.remove(srv)
            self.start_actor(srv, probe=True)
