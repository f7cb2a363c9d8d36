"""Proposing ahead, the pool's side: the next round's requests sent while the controller decides, collected
when a round asks for them, withdrawn for models that left, and settled (scored but never used) at the end.
"""

from __future__ import annotations

from typing import Any

import ray

WITHDRAW_TIMEOUT_S = 30.0  # an actor's control thread answers at once; a dead or hung actor must not stall the end


class AheadBatches:
    """The batches a :class:`~certeval.hosting.pool.ModelPool` sent ahead of their round: where each is, what
    each item scored, what each actor holds. The pool's actors, batches and counts stay the pool's."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.refs: dict[Any, tuple[Any, Any, int]] = {}  # batches sent ahead, not yet collected
        self.ids: dict[Any, str] = {}  # batch sent ahead -> its id (ModelWorker.withdraw)
        self.key: dict[tuple[str, str], Any] = {}  # (label, item key) -> its batch sent ahead
        self.done: dict[tuple[str, str], dict[str, Any]] = {}  # scored ahead, not yet taken by a round
        self.load: dict[str, int] = {}  # actor name -> its batches sent ahead, not yet collected

    def send(self, requests: dict[str, list[tuple[str, dict[str, Any]]]], batch_size: int,
                    current: set[tuple[str, str]]) -> None:
        """Queue ``requests`` on the actors now (each replica's least loaded first), without waiting: items
        already scored or in flight, here or ahead, are left out."""
        for group, labels in self.pool.groups.items():
            parts = []
            for label in labels:
                fresh = [(key, item) for key, item in requests.get(label, [])
                         if (label, key) not in current and (label, key) not in self.key
                         and (label, key) not in self.done]
                if fresh:
                    parts.append((label, fresh))
            for batch in self.pool._batches(group, parts, batch_size):
                slot = min(self.pool.slots[group], key=lambda s: s.outstanding + self.load.get(s.name, 0))
                batch.attempts = 1
                batch_id = f"{self.pool.prefix}/ahead/{self.pool.stats.batches}"
                ref = slot.handle.score.remote(batch.parts, False, batch_id)
                self.refs[ref] = (batch, slot, slot.generation)
                self.ids[ref] = batch_id
                self.load[slot.name] = self.load.get(slot.name, 0) + 1
                for label, _, keys in batch.parts:
                    for key in keys:
                        self.key[(label, key)] = ref
                self.pool.stats.batches += 1
                self.pool.stats.ahead_sent += batch.size
                for label, items, _ in batch.parts:
                    self.pool.stats.ahead_sent_per_model[label] = self.pool.stats.ahead_sent_per_model.get(label, 0) + len(items)

    def collect(self, ref: Any) -> bool:
        """A finished (or failed) batch sent ahead: its results kept for a later call; False when it was lost
        (its actor died: replaced here, once) or cancelled."""
        batch, slot, generation = self.drop(ref)
        try:
            results_per_part = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
            if slot.generation == generation:
                self.pool._replace(slot)
                slot.outstanding = 0
            self.pool.stats.ahead_lost += batch.size
            return False
        except ray.exceptions.RayError:  # cancelled, or the host failed on an item (sent again, it fails there)
            self.pool.stats.ahead_lost += batch.size
            return False
        if results_per_part is None:  # withdrawn before it began (a race with withdraw's own answer): not scored
            self.pool.stats.ahead_cancelled += batch.size
            return False
        for (label, _, keys), results in zip(batch.parts, results_per_part):
            for key, result in zip(keys, results):
                self.done[(label, key)] = result
        return True

    def drop(self, ref: Any) -> tuple[Any, Any, int]:
        """Forget a batch sent ahead (collected or withdrawn): its actor's load and its items' entries."""
        batch, slot, generation = self.refs.pop(ref)
        self.ids.pop(ref, None)
        self.load[slot.name] = max(0, self.load.get(slot.name, 0) - 1)
        for label, _, keys in batch.parts:
            for key in keys:
                if self.key.get((label, key)) is ref:
                    del self.key[(label, key)]
        return batch, slot, generation

    def withdraw(self, refs: list[Any]) -> None:
        """Withdraw the batches ``refs`` where no actor has begun them (counted cancelled: never scored); the rest
        stay sent ahead, to be collected as scored when they end. ``ray.cancel`` is not used: on Ray 2.60 an actor
        call it reports cancelled may still run and be cached, unreported."""
        by_slot: dict[str, tuple[Any, list[Any]]] = {}
        for ref in refs:
            slot = self.refs[ref][1]
            by_slot.setdefault(slot.name, (slot, []))[1].append(ref)
        asked = {}
        for slot, mine in by_slot.values():
            asked[slot.handle.withdraw.remote([self.ids[r] for r in mine])] = mine
        done, _ = ray.wait(list(asked), num_returns=len(asked), timeout=WITHDRAW_TIMEOUT_S) if asked else ([], [])
        for answer in done:
            try:
                withdrawn = set(ray.get(answer))
            except ray.exceptions.RayError:  # the actor died: its batches are lost when collected
                continue
            for ref in asked[answer]:
                if self.ids.get(ref) in withdrawn:
                    batch, _, _ = self.drop(ref)
                    self.pool.stats.ahead_cancelled += batch.size

    def cancel(self, labels: Any) -> None:
        """Models that left (``labels``) stop consuming: their batches sent ahead are withdrawn where an actor has
        not begun them (one begun finishes, and is kept and reported like any other)."""
        gone = set(labels)
        refs = [ref for ref, (batch, _, _) in self.refs.items()
                if all(label in gone for label, _, _ in batch.parts)]
        if refs:
            self.withdraw(refs)

    def settle(self) -> dict[str, Any]:
        """The run is decided: batches sent ahead that no actor has begun are withdrawn; those begun are awaited
        (each within ``batch_timeout_s`` of the last, else counted lost) and kept: the actors cached their scores.
        Returns what proposing ahead cost: items sent ahead, used by a round, scored but never used (per model),
        withdrawn before scoring (``cancelled``) or lost. The scored ones equal what the actors cached beyond the
        rounds' items."""
        if self.refs:
            self.withdraw(list(self.refs))
        pending = list(self.refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=self.pool.options.batch_timeout_s)
            if not done:  # a hung batch: the run's answer stands; what it held is counted lost
                for ref in pending:
                    batch, _, _ = self.drop(ref)
                    self.pool.stats.ahead_lost += batch.size
                break
            self.collect(done[0])
        unused: dict[str, int] = {}
        for label, _ in self.done:
            unused[label] = unused.get(label, 0) + 1
        stats = self.pool.stats
        return {"sent": stats.ahead_sent, "used": stats.ahead_used, "scored_unused": sum(unused.values()),
                "scored_unused_per_model": unused, "cancelled": stats.ahead_cancelled, "lost": stats.ahead_lost,
                "sent_per_model": dict(stats.ahead_sent_per_model)}
