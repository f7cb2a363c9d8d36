"""Long-lived Ray actors hosting models, and the driver that keeps them busy.

One :class:`ModelPool` holds, per model, ``replicas`` named actors, each wrapping
``make_host(spec)`` (``hosting/base.py``). The driver keeps up to
``in_flight`` batches queued per actor, so inference never waits on the
controller, and absorbs results in arrival order (``ray.wait``).

Replay models of the same scores file (same options) share one group of
``replicas`` actors: each such actor loads the table once and serves all of them
(``ReplayTable.shared``), and a batch carries parts for several models. Rankings
of thousands of recorded models then need two actors, not thousands. Every other
backend keeps one actor group per model.

Exactly-once scoring:

* scoring calls never retry inside Ray (``max_task_retries=0``): a call that
  killed its actor would otherwise burn every restart (docs/environment.md);
* an actor that dies mid-batch is replaced by a fresh one and only the lost
  batch is re-submitted; a batch whose result arrived is never sent again;
* the actor writes each finished batch to the score cache *before* returning
  it, so scores survive even when the driver is killed while the result is in
  flight, and a rerun reads them instead of asking the model again.

``options`` (:class:`~certeval.runtime.options.RuntimeOptions`) bounds the waits (actor start,
batches) and goes to every actor as a constructor argument: its ``call_log`` names a file to
which the actor appends ``model<TAB>item_id`` per item it scored (the call counter the crash
and actor-failure tests read), ``startup_log`` the start-up timeline, ``cache_dir`` the cache.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from certeval.errors import InputError
from certeval.runtime.options import FLAGS, RuntimeOptions, runtime_options

from .pool_ahead import AheadBatches
from .pool_cpus import CpuPlan
from .pool_groups import KEPT_PREFIX, _cluster_summary, _text_length, group_models
from .ray_setup import NAMESPACE, _forwarded_env, _secret_env, key_variables
from .worker import CONTROL, ModelWorker, _ping_answer

MAX_ATTEMPTS = 3
# libgomp spin iterations before an idle thread sleeps where other work fills the cores (a few microseconds; its
# default is 300,000)
OPENMP_SPIN_COUNT = "3000"


def _cores_busy(load: float | None = None, cores: int | None = None) -> bool:
    """Whether other work already fills the cores of the node the command runs on: a 1-minute load average of at
    least its core count plus one (the command's own driver and services count in it). An actor placed on another
    node of a cluster is judged by this node's load too (Ray places it after this is decided). An actor's idle
    OpenMP threads then spin only briefly before they sleep: OpenMP's long default spin starves a loaded box (24
    items: 102-271 s at load 16-36, 26-42 s never spinning), while on a box with spare cores it wakes threads at
    once on each small step of greedy decoding (300 generation items: 40-47 s of rounds against 47-62 s spinning
    briefly, idle 2-core box). Never spinning (``OMP_WAIT_POLICY=PASSIVE``) is slower still (5.0 vs 7.0 items/s)."""
    load = os.getloadavg()[0] if load is None else load
    cores = (os.cpu_count() or 1) if cores is None else cores
    return load >= cores + 1


@dataclass
class _Batch:
    group: str
    parts: list[tuple[str, list[dict[str, Any]], list[str]]]  # (label, items, keys)
    attempts: int = 0

    @property
    def size(self) -> int:
        return sum(len(items) for _, items, _ in self.parts)


@dataclass
class _Slot:
    label: str
    replica: int
    handle: Any
    name: str
    generation: int = 0
    outstanding: int = 0
    kept: bool = False  # a detached actor that outlives the command (keep=True): never killed by shutdown


@dataclass
class PoolStats:
    batches: int = 0
    resubmitted: int = 0
    replaced_actors: int = 0
    items: int = 0
    seconds: float = 0.0
    per_model_items: dict[str, int] = field(default_factory=dict)
    per_replica_batches: dict[str, int] = field(default_factory=dict)  # "label/replica" -> batches returned
    max_in_flight: int = 0  # most batches outstanding at once
    placement: list[dict[str, Any]] = field(default_factory=list)  # one entry per actor ever started
    shared: dict[str, list[str]] = field(default_factory=dict)  # actors that host several models: their labels
    ahead_sent: int = 0  # items sent ahead of their round (score(..., ahead=...))
    ahead_used: int = 0  # of those, items a round took
    ahead_cancelled: int = 0  # items of batches withdrawn before an actor began them (never scored)
    ahead_lost: int = 0  # items of batches lost with their actor (sent again when a round needed them)
    ahead_sent_per_model: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Actors:
    """How a pool lays out its actors: ``replicas`` per model (actor group), the GPUs and CPUs each asks Ray for
    (``num_cpus`` None: a CPU-hosted model's share of the free CPUs, 0 for replay), ``in_flight`` batches per
    actor, and ``keep``: named detached actors that outlive the command (``--keep-actors``)."""

    replicas: int = 1
    num_gpus: float = 0.0
    num_cpus: float | None = None
    in_flight: int = 2
    keep: bool = False


class ModelPool:
    """Named actors per model; ``score`` fans batches out and gathers them in arrival order.

    ``models`` maps a display label to a model spec string; ``cache_urls`` maps
    the label to its score-cache folder (or is empty: no cache).
    """

    def __init__(self, models: dict[str, str], actors: Actors | None = None, *,
                 cache_urls: dict[str, str] | None = None, options: RuntimeOptions | None = None,
                 run_id: str | None = None, host_kwargs: dict[str, Any] | None = None,
                 contents: dict[str, str] | None = None) -> None:
        actors = actors or Actors()
        replicas, num_gpus, num_cpus, in_flight, keep = (actors.replicas, actors.num_gpus, actors.num_cpus,
                                                         actors.in_flight, actors.keep)
        if replicas < 1:
            raise InputError(f"--replicas must be at least 1, got {replicas!r}")
        if in_flight < 1:
            raise InputError(f"--in-flight must be at least 1, got {in_flight!r}")
        self.models = dict(models)
        self.replicas = replicas
        self.num_gpus = float(num_gpus)
        self.num_cpus = num_cpus
        self.in_flight = in_flight
        self.cache_urls = dict(cache_urls or {})
        self.options = runtime_options(options)
        self.host_kwargs = dict(host_kwargs or {})
        self.keep = bool(keep)  # --keep-actors: named detached actors, found again by the next command
        # per label, the digest of the files its model is loaded from: a kept actor holding earlier weights of
        # the same folder is another actor (its name differs), never adopted
        self.contents = dict(contents or {})
        self.key_variables = key_variables(self.models.values())
        self.prefix = f"{run_id or 'pool'}-{uuid.uuid4().hex[:6]}"
        self.groups = group_models(self.models)  # actor group -> labels it serves
        self.group_of = {label: g for g, labels in self.groups.items() for label in labels}
        self.slots: dict[str, list[_Slot]] = {}  # actor group -> its replicas
        self.stats = PoolStats()
        self._pings: list[tuple[str, str, int, int, Any]] = []  # placement still to read
        self._node_of: dict[str, str] = {}  # actor name -> the Ray node it answered from
        self.cpus = CpuPlan(self.models, self.replicas, self.num_gpus, num_cpus, self.host_kwargs)
        self._cpu_share: dict[str, float] = {}  # CPU-hosted groups -> the CPUs each actor asks for (launch)
        self.ahead = AheadBatches(self)  # proposing ahead: the next round's batches, queued behind this one's

    # -- actors -------------------------------------------------------------
    def _actor_cpus(self, group: str) -> float:
        """The CPUs an actor of ``group`` asks Ray for (:meth:`CpuPlan.actor_cpus`)."""
        return self.cpus.actor_cpus(self.groups[group], self._cpu_share.get(group, 1.0))

    def _calls_at_once(self, group: str) -> int:
        """The calls an actor of ``group`` scores at once (:meth:`CpuPlan.calls_at_once`)."""
        return self.cpus.calls_at_once(self.groups[group], self._actor_cpus(group), self.in_flight)

    def _actor_class(self):
        # a control thread beside the scoring one: batches sent ahead are withdrawn while another is scored
        return ray.remote(concurrency_groups={CONTROL: 1})(ModelWorker)

    def _kept_name(self, group: str, replica: int) -> str:
        """A kept actor's name: what it hosts (spec texts and their files' digests, host options, GPUs) and its
        replica, never the labels or the run, so another command on the same models finds it."""
        import hashlib
        import json

        what = json.dumps([sorted((self.models[label], self.contents.get(label, "")) for label in self.groups[group]),
                           sorted((str(k), str(v)) for k, v in self.host_kwargs.items()), self.num_gpus])
        return f"{KEPT_PREFIX}{hashlib.sha256(what.encode()).hexdigest()[:16]}/{replica}"

    def _adopt(self, group: str, replica: int) -> _Slot | None:
        """The kept actor for ``group``/``replica`` if one is alive, adopted for this command; else None."""
        name = self._kept_name(group, replica)
        try:
            handle = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:  # none by that name
            return None
        labels = self.groups[group]
        answer = handle.adopt.remote({label: self.models[label] for label in labels},
                                     {label: self.cache_urls.get(label) for label in labels}, self.options,
                                     _secret_env(self.key_variables))
        self._pings.append((name, group, replica, 0, answer))
        return _Slot(group, replica, handle, name, 0, kept=True)

    def _new_actor(self, group: str, replica: int, generation: int, avoid: str | None = None) -> _Slot:
        kept = self.keep and generation == 0  # a replacement after a death is the command's own
        if kept:
            found = self._adopt(group, replica)
            if found is not None:
                return found
        labels = self.groups[group]
        cpus = self._actor_cpus(group)
        name = self._kept_name(group, replica) if kept else f"{self.prefix}/{group}/{replica}/g{generation}"
        at_once = self._calls_at_once(group)
        threads = self.cpus.threads(labels, cpus, at_once)
        env = _forwarded_env(self.key_variables)
        if threads is not None:  # OpenMP's pool sized before torch starts; the worker sets torch's own too
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
            if threads > 1 and not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ) and _cores_busy():
                env["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT
        extra = dict(lifetime="detached", get_if_exists=True) if kept else {}  # two commands at once: one actor
        handle = self._cls.options(
            name=name, namespace=NAMESPACE, num_cpus=cpus, num_gpus=self.num_gpus, max_restarts=0,
            max_task_retries=0, max_concurrency=at_once, runtime_env={"env_vars": env},
            scheduling_strategy=self._spread(replica, cpus, avoid), **extra,
        ).remote({label: self.models[label] for label in labels},
                 {label: self.cache_urls.get(label) for label in labels}, self.options, self.host_kwargs,
                 _secret_env(self.key_variables), threads)
        if kept:  # adopt, not ping: the actor may be another command's, created a moment before
            answer = handle.adopt.remote({label: self.models[label] for label in labels},
                                         {label: self.cache_urls.get(label) for label in labels}, self.options,
                                         _secret_env(self.key_variables))
        else:
            answer = handle.ping.remote()
        self._pings.append((name, group, replica, generation, answer))
        return _Slot(group, replica, handle, name, generation, kept=kept)

    def _spread(self, replica: int, cpus: float, avoid: str | None = None) -> Any:
        """Replica ``r`` of every group goes to the ``r``-th live node able to host it (round robin), so the
        replicas of a model sit on distinct nodes and losing a node costs one replica. Strict affinity: Ray's
        soft affinity and SPREAD both put replay actors (0 CPUs) on the head. One such node: Ray's default.

        ``avoid``: the node a dead actor ran on. Its replacement goes elsewhere while another node can host
        it: Ray still lists a node whose raylet was just killed as alive for seconds, and an actor pinned
        there would die with it."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        able = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive")
                      and n.get("Resources", {}).get("GPU", 0.0) >= self.num_gpus
                      and n.get("Resources", {}).get("CPU", 0.0) >= cpus)
        if avoid in able and len(able) > 1:
            able.remove(avoid)
        elif len(able) < 2:
            return "DEFAULT"
        return NodeAffinitySchedulingStrategy(able[replica % len(able)], soft=False)

    def placement(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Where every actor started so far ran: ``actor, group, replica, generation, node_id, node_resources,
        pid`` (``node_id`` None for an actor that died before answering). Also kept in ``stats.placement``."""
        if self._pings:
            refs = [p[-1] for p in self._pings]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            ready = set(ready)
            nodes = {n["NodeID"]: n for n in ray.nodes()}
            for name, group, replica, generation, ref in self._pings:
                where = _ping_answer(ref) if ref in ready else {}
                if where.get("node_id"):
                    self._node_of[name] = where["node_id"]
                node = nodes.get(where.get("node_id"), {})
                custom = sorted(k for k in node.get("Resources", {})
                                if k not in ("CPU", "GPU", "memory", "object_store_memory") and not k.startswith("node:"))
                self.stats.placement.append({
                    "actor": name, "group": group, "replica": replica, "generation": generation,
                    "node_id": where.get("node_id"), "node_resources": custom, "pid": where.get("pid"),
                    "cpus": self._actor_cpus(group), "torch_threads": where.get("torch_threads"),
                    "calls_at_once": self._calls_at_once(group),
                    "kept": name.startswith(KEPT_PREFIX), "reused": bool(where.get("reused", False)),
                    "load_s": where.get("load_s")})
            self._pings = []
        return list(self.stats.placement)

    def start(self) -> ModelPool:
        """Create every actor and wait until each host is built (errors surface here, once)."""
        return self.launch().wait_started()

    def launch(self) -> ModelPool:
        """Create every actor without waiting for it (:meth:`wait_started` waits); idempotent."""
        if self.slots:
            return self
        self.cpus.check_gpus()
        merged = self.cpus.shared_groups(self.groups)
        if merged is not None:  # more CPUs asked than the cluster has: models share actors
            self.groups = merged
            self.group_of = {label: g for g, labels in merged.items() for label in labels}
            self.stats.shared = {g: list(labels) for g, labels in merged.items() if len(labels) > 1}
        self._cls = self._actor_class()
        self._cpu_share = self.cpus.shares(self.groups)
        for group in self.groups:
            self.slots[group] = [self._new_actor(group, r, 0) for r in range(self.replicas)]
        return self

    def wait_started(self) -> ModelPool:
        """Wait until every host :meth:`launch` created is built (errors surface here, once)."""
        timeout = self.options.actor_start_timeout_s
        try:
            ray.get([p[-1] for p in self._pings], timeout=timeout)
            self.placement()
        except ray.exceptions.GetTimeoutError:
            self.shutdown()
            raise RuntimeError(f"the model actors did not start within {timeout:g} s (each asks for "
                               f"{self.num_gpus:g} GPU(s); the cluster has {_cluster_summary()}); raise "
                               f"{FLAGS['actor_start_timeout_s']} for slow model loads") from None
        except ray.exceptions.RayActorError as exc:
            cause = getattr(exc, "cause", None) or exc
            self.shutdown()
            if isinstance(cause, InputError):
                raise cause from None
            raise RuntimeError(f"a model actor failed to start: {cause}") from None
        return self

    def _dead_node(self, name: str) -> str | None:
        """The node the actor ``name`` answered its start-up ping from, if it did (None if unknown)."""
        if name in self._node_of:
            return self._node_of[name]
        for pinged, _, _, _, ref in self._pings:  # started but not yet read by placement()
            if pinged == name and ray.wait([ref], timeout=0)[0]:
                return _ping_answer(ref).get("node_id")
        return None

    def _replace(self, slot: _Slot) -> None:
        try:
            ray.kill(slot.handle, no_restart=True)
        except Exception:  # already gone
            pass
        fresh = self._new_actor(slot.label, slot.replica, slot.generation + 1, avoid=self._dead_node(slot.name))
        slot.handle, slot.name, slot.generation = fresh.handle, fresh.name, fresh.generation
        self.stats.replaced_actors += 1

    # -- scoring ------------------------------------------------------------
    supports_ahead = True  # score(..., ahead=...): the next round's items queued behind this one's

    def score(self, requests: dict[str, list[tuple[str, dict[str, Any]]]], batch_size: int,
              on_result: Callable[[str, list[dict[str, Any]]], None] | None = None,
              ahead: Callable[[], dict[str, list[tuple[str, dict[str, Any]]]]] | None = None,
              ) -> dict[str, list[dict[str, Any]]]:
        """Score ``requests[label] = [(item_key, item), ...]``; return results per label.

        Batches of at most ``batch_size`` items go to the model's replicas, up
        to ``in_flight`` per replica; ``on_result(label, results)`` is called in
        arrival order. A batch lost with its actor is re-submitted to a fresh
        actor (at most ``MAX_ATTEMPTS`` times).

        ``ahead``: called once every batch of this call is submitted; the requests it returns (the next round's
        items as the caller predicts them) are queued on the actors behind this call's batches and not waited
        for, so the models work while the caller decides. A later call takes an item scored or still in flight
        ahead from there instead of sending it again; what no call takes is reported by :meth:`settle`.
        """
        t0 = time.perf_counter()
        queues: dict[str, deque[_Batch]] = {}
        for label in requests:
            if label not in self.group_of:
                raise InputError(f"model {label!r} is not hosted by this pool")
        out: dict[str, list[dict[str, Any]]] = {label: [] for label in requests}
        waiting: dict[Any, list[tuple[str, str, dict[str, Any]]]] = {}  # ahead batch -> (label, key, item) taken
        taken: dict[str, list[dict[str, Any]]] = {}
        todo: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for label, pairs in requests.items():
            rest = []
            for key, item in pairs:
                done = self.ahead.done.pop((label, key), None)
                if done is not None:
                    taken.setdefault(label, []).append(done)
                elif (label, key) in self.ahead.key:
                    waiting.setdefault(self.ahead.key[(label, key)], []).append((label, key, item))
                else:
                    rest.append((key, item))
            todo[label] = rest
        for group, labels in self.groups.items():
            queue = self._batches(group, [(label, todo[label]) for label in labels if todo.get(label)],
                                  max(1, batch_size))
            if queue:
                queues[group] = queue
        running: dict[Any, tuple[_Batch, _Slot, int]] = {}

        def deliver(label: str, results: list[dict[str, Any]], from_ahead: bool = False) -> None:
            out[label].extend(results)
            self.stats.items += len(results)
            self.stats.per_model_items[label] = self.stats.per_model_items.get(label, 0) + len(results)
            if from_ahead:
                self.stats.ahead_used += len(results)
            if on_result is not None:
                on_result(label, results)

        def fill() -> None:
            for group, queue in queues.items():
                for slot in self.slots[group]:
                    while queue and slot.outstanding < self.in_flight:
                        batch = queue.popleft()
                        batch.attempts += 1
                        ref = slot.handle.score.remote(batch.parts, batch.attempts > 1)
                        slot.outstanding += 1
                        running[ref] = (batch, slot, slot.generation)
                        self.stats.batches += 1
            if ahead_fn and not any(queues.values()):  # this call's batches all sent: queue the next round's
                self.ahead.send(ahead_fn.pop()(), max(1, batch_size), current)

        current = {(label, key) for label, pairs in requests.items() for key, _ in pairs}
        ahead_fn = [ahead] if ahead is not None else []
        for label, results in taken.items():
            deliver(label, results, from_ahead=True)
        fill()
        stall_s = self.options.batch_timeout_s
        while running or waiting:
            self.stats.max_in_flight = max(self.stats.max_in_flight, len(running))
            # bounded: a hung actor (deadlocked model, lost GPU) fails the round instead of waiting for ever
            done, _ = ray.wait(list(running) + list(waiting), num_returns=1, timeout=stall_s)
            if not done:
                raise RuntimeError(f"no batch came back from the model actors within {stall_s:g} s "
                                   f"({len(running) + len(waiting)} in flight); raise {FLAGS['batch_timeout_s']} "
                                   "for slower models")
            ref = done[0]
            if ref in waiting:  # a batch sent ahead that holds items of this call
                wanted = waiting.pop(ref)
                self.ahead.collect(ref)
                lost: dict[str, list[tuple[str, dict[str, Any]]]] = {}
                for label, key, item in wanted:
                    result = self.ahead.done.pop((label, key), None)
                    if result is not None:
                        deliver(label, [result], from_ahead=True)
                    else:  # lost with its actor, or cancelled: sent again as any other batch
                        lost.setdefault(label, []).append((key, item))
                for group, labels in self.groups.items():
                    again = self._batches(group, [(label, lost[label]) for label in labels if lost.get(label)],
                                          max(1, batch_size))
                    if again:
                        queues.setdefault(group, deque()).extend(again)
                fill()
                continue
            batch, slot, generation = running.pop(ref)
            if slot.generation == generation:
                slot.outstanding -= 1
            try:
                results_per_part = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):  # the actor or its node died
                if batch.attempts >= MAX_ATTEMPTS:
                    labels = ", ".join(repr(label) for label, _, _ in batch.parts[:3])
                    raise RuntimeError(f"model {labels}: a batch was lost {batch.attempts} times with its actor") from None
                if slot.generation == generation:  # first news of this death: one replacement per dead actor
                    self._replace(slot)
                    slot.outstanding = 0
                queues[batch.group].appendleft(batch)
                self.stats.resubmitted += 1
                fill()
                continue
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, InputError):
                    raise cause from None
                raise
            replica = f"{batch.group}/{slot.replica}"
            self.stats.per_replica_batches[replica] = self.stats.per_replica_batches.get(replica, 0) + 1
            for (label, _, _), results in zip(batch.parts, results_per_part):
                deliver(label, results)
            fill()
        if ahead_fn:  # nothing was sent in this call
            self.ahead.send(ahead_fn.pop()(), max(1, batch_size), current)
        if self._pings:  # replacements started during this call: record where they run, waiting as long as an
            # actor may take to start (a busy machine takes more than placement's default 10 s; after a node loss only)
            self.placement(timeout_s=self.options.actor_start_timeout_s)
        self.stats.seconds += time.perf_counter() - t0
        return out

    # -- proposing ahead (AheadBatches) --------------------------------------
    def cancel_ahead(self, labels: Any) -> None:
        """Models that left (``labels``) stop consuming: their batches sent ahead are withdrawn where an actor has
        not begun them (one begun finishes, and is kept and reported like any other)."""
        self.ahead.cancel(labels)

    def settle(self) -> dict[str, Any]:
        """The run is decided: what proposing ahead sent, used, left scored but unused, withdrawn or lost
        (:meth:`AheadBatches.settle`)."""
        return self.ahead.settle()

    # -- batches ------------------------------------------------------------
    def _batches(self, group: str, requests: list[tuple[str, list[tuple[str, dict[str, Any]]]]],
                 batch_size: int) -> deque[_Batch]:
        """Chunks of at most ``batch_size`` items per model; an actor serving many models gets them packed
        into about ``replicas * in_flight`` calls (one Ray round trip per call, not per model)."""
        chunks = []
        on_cpu = self.cpus.on_cpu(self.groups[group])
        for label, pairs in requests:
            if on_cpu:  # a round's items longest first across its calls, as each call sorts its own pairs
                pairs = sorted(pairs, key=lambda pair: -_text_length(pair[1]))
            for i in range(0, len(pairs), batch_size):
                chunk = pairs[i:i + batch_size]
                chunks.append((label, [it for _, it in chunk], [k for k, _ in chunk]))
        total = sum(len(items) for _, items, _ in chunks)
        capacity = batch_size if len(self.groups[group]) == 1 else \
            max(batch_size, -(-total // (len(self.slots[group]) * self.in_flight)))
        queue: deque[_Batch] = deque()
        filled = 0  # items in queue[-1], kept as we go (summing its parts each time was quadratic in the models)
        for part in chunks:
            if queue and filled + len(part[1]) <= capacity:
                queue[-1].parts.append(part)
                filled += len(part[1])
            else:
                queue.append(_Batch(group, [part]))
                filled = len(part[1])
        return queue

    def shutdown(self) -> None:
        """Kill every actor but the kept ones (``keep``: they outlive the command, for the next one)."""
        for slots in self.slots.values():
            for slot in slots:
                if slot.kept:
                    continue
                try:
                    ray.kill(slot.handle, no_restart=True)
                except Exception:  # already dead or its node gone: nothing left to release
                    pass
        self.slots = {}
