"""Long-lived Ray actors hosting models, and the driver that keeps them busy.

One :class:`ModelPool` holds, per model, ``replicas`` named actors, each wrapping
``make_host(spec)`` (``backends/base.py``). The driver keeps up to
``in_flight`` batches queued per actor, so inference never waits on the
controller, and absorbs results in arrival order (``ray.wait``).

Exactly-once scoring:

* scoring calls never retry inside Ray (``max_task_retries=0``): a call that
  killed its actor would otherwise burn every restart (NOTES.md);
* an actor that dies mid-batch is replaced by a fresh one and only the lost
  batch is re-submitted; a batch whose result arrived is never sent again;
* the actor writes each finished batch to the score cache *before* returning
  it, so scores survive even when the driver is killed while the result is in
  flight, and a rerun reads them instead of asking the model again.

``CERTEVAL_BACKEND_LOG`` (or ``call_log=``) names a file to which every actor
appends ``model<TAB>item_id`` per item it scored: the call counter the
crash and actor-failure tests read.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import ray

from ..envsetup import configure_offline_env, ray_bootstrap_home
from ..estimators._validation import InputError

NAMESPACE = "certeval"
CALL_LOG_ENV = "CERTEVAL_BACKEND_LOG"
# variables an actor needs from the driver even when Ray was started earlier (e.g. a test session)
_FORWARDED_ENV_PREFIXES = ("RAY_AUTH_", "AWS_", "CERTEVAL_", "HF_", "TRANSFORMERS_", "OPENAI_", "TOKENIZERS_", "CUDA_VISIBLE")
MAX_ATTEMPTS = 3


def init_ray(address: str | None = None, *, num_cpus: int = 2, object_store_mb: int = 200,
             state_dir: str | Path | None = None) -> None:
    """Start a local Ray (loopback only) or connect to ``address``; idempotent.

    HOME points at a folder holding ``ray_bootstrap_config.yaml`` while
    ``ray.init`` runs, or Ray's usage-stats module probes cloud metadata
    (NOTES.md); workers get the real HOME back through ``runtime_env``.
    """
    if ray.is_initialized():
        return
    configure_offline_env()
    base = Path(state_dir) if state_dir else Path(tempfile.gettempdir()) / f"certeval-ray-{os.getuid()}"
    real_home = os.environ.get("HOME", str(Path.home()))
    ray_home = ray_bootstrap_home(base)
    _pin_auth_token(ray_home, Path(real_home), local=not address)
    os.environ["HOME"] = str(ray_home)
    try:
        common = dict(namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING,
                      runtime_env={"env_vars": {"HOME": real_home}})
        if address:
            try:
                ray.init(address=address, **common)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise InputError(f"--ray-address {address!r} is unreachable: {str(exc).splitlines()[0]}") from None
        else:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                     object_store_memory=object_store_mb * 2**20, **common)
    finally:
        os.environ["HOME"] = real_home


def _pin_auth_token(ray_home: Path, real_home: Path, *, local: bool) -> None:
    """Name Ray's auth token file explicitly (RAY_AUTH_TOKEN_PATH).

    Ray looks for ``~/.ray/auth_token``; HOME differs between ``ray.init`` (the
    bootstrap folder) and the workers (the user's HOME), so without a fixed path
    workers fail to start. A new local cluster gets a fresh token in the
    bootstrap folder; a remote one uses the user's token.
    """
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    if local:
        import secrets

        token = ray_home / ".ray" / "auth_token"
        if not token.exists():
            token.parent.mkdir(parents=True, exist_ok=True)
            token.write_text(secrets.token_hex(32))
            token.chmod(0o600)
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    elif (real_home / ".ray" / "auth_token").exists():
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(real_home / ".ray" / "auth_token")


def _forwarded_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_ENV_PREFIXES)}


class ModelWorker:
    """The body of one model actor: a host, the score cache and the call log."""

    def __init__(self, spec_text: str, label: str, cache_url: str | None, call_log: str | None,
                 host_kwargs: dict[str, Any] | None = None) -> None:
        from .base import make_host

        self.label = label
        self.host = make_host(spec_text, **(host_kwargs or {}))
        self.cache = None
        if cache_url:
            from ..storage import ScoreCache, filesystem

            self.cache = ScoreCache(*filesystem(cache_url))
        self.call_log = call_log or os.environ.get(CALL_LOG_ENV)

    def ping(self) -> int:
        return os.getpid()

    @ray.method(max_task_retries=0)  # a retried call could score a batch twice; lost batches are re-sent by the driver
    def score(self, items: list[dict[str, Any]], keys: list[str]) -> list[dict[str, Any]]:
        from ..storage import ScoreCache

        results = self.host.score(items)
        if len(results) != len(items):
            raise RuntimeError(f"host for {self.label!r} returned {len(results)} results for {len(items)} items")
        if self.cache is not None:  # persist before returning: a dead driver loses nothing paid for
            rows = [{**{c: r.get(c) for c in ScoreCache.COLUMNS if c != "item_key"}, "item_key": k}
                    for r, k in zip(results, keys)]
            for row in rows:
                row["tokens"] = int(row["tokens"] or 0)
                row["latency_s"] = float(row["latency_s"] or 0.0)
            self.cache.add(rows)
        if self.call_log:
            with open(self.call_log, "a") as handle:  # O_APPEND: one write, no interleaving
                handle.write("".join(f"{self.label}\t{r['item_id']}\n" for r in results))
        return results

    def close(self) -> None:
        self.host.close()


@dataclass
class _Batch:
    label: str
    items: list[dict[str, Any]]
    keys: list[str]
    attempts: int = 0


@dataclass
class _Slot:
    label: str
    replica: int
    handle: Any
    name: str
    generation: int = 0
    outstanding: int = 0


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


class ModelPool:
    """Named actors per model; ``score`` fans batches out and gathers them in arrival order.

    ``models`` maps a display label to a model spec string; ``cache_urls`` maps
    the label to its score-cache folder (or is empty: no cache).
    """

    def __init__(self, models: dict[str, str], *, replicas: int = 1, num_gpus: float = 0.0,
                 num_cpus: float | None = None, in_flight: int = 2, cache_urls: dict[str, str] | None = None,
                 call_log: str | None = None, run_id: str | None = None,
                 host_kwargs: dict[str, Any] | None = None) -> None:
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
        self.call_log = call_log
        self.host_kwargs = dict(host_kwargs or {})
        self.prefix = f"{run_id or 'pool'}-{uuid.uuid4().hex[:6]}"
        self.slots: dict[str, list[_Slot]] = {}
        self.stats = PoolStats()

    # -- actors -------------------------------------------------------------
    def _actor_class(self):
        return ray.remote(ModelWorker)

    def _new_actor(self, label: str, replica: int, generation: int) -> _Slot:
        spec = self.models[label]
        cpus = self.num_cpus if self.num_cpus is not None else (0.0 if spec.startswith("replay:") else 1.0)
        name = f"{self.prefix}/{label}/{replica}/g{generation}"
        handle = self._cls.options(
            name=name, namespace=NAMESPACE, num_cpus=cpus, num_gpus=self.num_gpus, max_restarts=0,
            max_task_retries=0, runtime_env={"env_vars": _forwarded_env()},
        ).remote(spec, label, self.cache_urls.get(label), self.call_log, self.host_kwargs)
        return _Slot(label, replica, handle, name, generation)

    def start(self) -> "ModelPool":
        """Create every actor and wait until each host is built (errors surface here, once)."""
        self._cls = self._actor_class()
        for label in self.models:
            self.slots[label] = [self._new_actor(label, r, 0) for r in range(self.replicas)]
        pings = {s.handle.ping.remote(): s for slots in self.slots.values() for s in slots}
        try:
            ray.get(list(pings))
        except ray.exceptions.RayActorError as exc:
            cause = getattr(exc, "cause", None) or exc
            self.shutdown()
            if isinstance(cause, InputError):
                raise cause from None
            raise RuntimeError(f"a model actor failed to start: {cause}") from None
        return self

    def actor_names(self, label: str | None = None) -> list[str]:
        return [s.name for lab, slots in self.slots.items() if label in (None, lab) for s in slots]

    def _replace(self, slot: _Slot) -> None:
        try:
            ray.kill(slot.handle, no_restart=True)
        except Exception:  # already gone
            pass
        fresh = self._new_actor(slot.label, slot.replica, slot.generation + 1)
        slot.handle, slot.name, slot.generation = fresh.handle, fresh.name, fresh.generation
        self.stats.replaced_actors += 1

    # -- scoring ------------------------------------------------------------
    def score(self, requests: dict[str, list[tuple[str, dict[str, Any]]]], batch_size: int,
              on_result: Callable[[str, list[dict[str, Any]]], None] | None = None) -> dict[str, list[dict[str, Any]]]:
        """Score ``requests[label] = [(item_key, item), ...]``; return results per label.

        Batches of at most ``batch_size`` items go to the model's replicas, up
        to ``in_flight`` per replica; ``on_result(label, results)`` is called in
        arrival order. A batch lost with its actor is re-submitted to a fresh
        actor (at most ``MAX_ATTEMPTS`` times).
        """
        t0 = time.perf_counter()
        queues: dict[str, deque[_Batch]] = {}
        for label, pairs in requests.items():
            if label not in self.slots:
                raise InputError(f"model {label!r} is not hosted by this pool")
            queue = deque()
            for i in range(0, len(pairs), max(1, batch_size)):
                chunk = pairs[i:i + batch_size]
                queue.append(_Batch(label, [it for _, it in chunk], [k for k, _ in chunk]))
            queues[label] = queue
        out: dict[str, list[dict[str, Any]]] = {label: [] for label in requests}
        running: dict[Any, tuple[_Batch, _Slot, int]] = {}

        def fill() -> None:
            for label, queue in queues.items():
                for slot in self.slots[label]:
                    while queue and slot.outstanding < self.in_flight:
                        batch = queue.popleft()
                        batch.attempts += 1
                        ref = slot.handle.score.remote(batch.items, batch.keys)
                        slot.outstanding += 1
                        running[ref] = (batch, slot, slot.generation)
                        self.stats.batches += 1

        fill()
        while running:
            self.stats.max_in_flight = max(self.stats.max_in_flight, len(running))
            done, _ = ray.wait(list(running), num_returns=1)
            ref = done[0]
            batch, slot, generation = running.pop(ref)
            if slot.generation == generation:
                slot.outstanding -= 1
            try:
                results = ray.get(ref)
            except ray.exceptions.RayActorError:
                if batch.attempts >= MAX_ATTEMPTS:
                    raise RuntimeError(f"model {batch.label!r}: a batch was lost {batch.attempts} times with its actor") from None
                if slot.generation == generation:  # first news of this death: one replacement per dead actor
                    self._replace(slot)
                    slot.outstanding = 0
                queues[batch.label].appendleft(batch)
                self.stats.resubmitted += 1
                fill()
                continue
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, InputError):
                    raise cause from None
                raise
            out[batch.label].extend(results)
            replica = f"{batch.label}/{slot.replica}"
            self.stats.per_replica_batches[replica] = self.stats.per_replica_batches.get(replica, 0) + 1
            self.stats.items += len(results)
            self.stats.per_model_items[batch.label] = self.stats.per_model_items.get(batch.label, 0) + len(results)
            if on_result is not None:
                on_result(batch.label, results)
            fill()
        self.stats.seconds += time.perf_counter() - t0
        return out

    def shutdown(self) -> None:
        for slots in self.slots.values():
            for slot in slots:
                try:
                    ray.kill(slot.handle, no_restart=True)
                except Exception:
                    pass
        self.slots = {}
