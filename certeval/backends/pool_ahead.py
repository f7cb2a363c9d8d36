"""The pool's half of proposing ahead: the next round's requests sent while the controller decides, collected
when a round asks for them, withdrawn for models that left, and settled (scored but never used) at the end.
Split from :mod:`certeval.backends.pool`."""

from __future__ import annotations

from typing import Any

import ray

WITHDRAW_TIMEOUT_S = 30.0  # an actor's control thread answers at once; a dead or hung actor must not stall the end


class PoolAhead:
    """Mixed into :class:`certeval.backends.pool.ModelPool` (its actors, batches and stats)."""

    def _send_ahead(self, requests: dict[str, list[tuple[str, dict[str, Any]]]], batch_size: int,
                    current: set[tuple[str, str]]) -> None:
        """Queue ``requests`` on the actors now (each replica's least loaded first), without waiting: items
        already scored or in flight, here or ahead, are left out."""
        for group, labels in self.groups.items():
            parts = []
            for label in labels:
                fresh = [(key, item) for key, item in requests.get(label, [])
                         if (label, key) not in current and (label, key) not in self._ahead_key
                         and (label, key) not in self._ahead_done]
                if fresh:
                    parts.append((label, fresh))
            for batch in self._batches(group, parts, batch_size):
                slot = min(self.slots[group], key=lambda s: s.outstanding + self._ahead_load.get(s.name, 0))
                batch.attempts = 1
                batch_id = f"{self.prefix}/ahead/{self.stats.batches}"
                ref = slot.handle.score.remote(batch.parts, False, batch_id)
                self._ahead_refs[ref] = (batch, slot, slot.generation)
                self._ahead_ids[ref] = batch_id
                self._ahead_load[slot.name] = self._ahead_load.get(slot.name, 0) + 1
                for label, _, keys in batch.parts:
                    for key in keys:
                        self._ahead_key[(label, key)] = ref
                self.stats.batches += 1
                self.stats.ahead_sent += batch.size
                for label, items, _ in batch.parts:
                    self.stats.ahead_sent_per_model[label] = self.stats.ahead_sent_per_model.get(label, 0) + len(items)

    def _collect_ahead(self, ref: Any) -> bool:
        """A finished (or failed) batch sent ahead: its results kept for a later call; False when it was lost
        (its actor died: replaced here, once) or cancelled."""
        batch, slot, generation = self._drop_ahead(ref)
        try:
            results_per_part = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
            if slot.generation == generation:
                self._replace(slot)
                slot.outstanding = 0
            self.stats.ahead_lost += batch.size
            return False
        except ray.exceptions.RayError:  # cancelled, or the host failed on an item (sent again, it fails there)
            self.stats.ahead_lost += batch.size
            return False
        if results_per_part is None:  # withdrawn before it began (a race with withdraw's own answer): not scored
            self.stats.ahead_cancelled += batch.size
            return False
        for (label, _, keys), results in zip(batch.parts, results_per_part):
            for key, result in zip(keys, results):
                self._ahead_done[(label, key)] = result
        return True

    def _drop_ahead(self, ref: Any) -> tuple[Any, Any, int]:
        """Forget a batch sent ahead (collected or withdrawn): its actor's load and its items' entries."""
        batch, slot, generation = self._ahead_refs.pop(ref)
        self._ahead_ids.pop(ref, None)
        self._ahead_load[slot.name] = max(0, self._ahead_load.get(slot.name, 0) - 1)
        for label, _, keys in batch.parts:
            for key in keys:
                if self._ahead_key.get((label, key)) is ref:
                    del self._ahead_key[(label, key)]
        return batch, slot, generation

    def _withdraw(self, refs: list[Any]) -> None:
        """Withdraw the batches ``refs`` where no actor has begun them (counted cancelled: never scored); the rest
        stay sent ahead, to be collected as scored when they end. ``ray.cancel`` is not used: on Ray 2.60 an actor
        call it reports cancelled may still run and be cached, unreported."""
        by_slot: dict[str, tuple[Any, list[Any]]] = {}
        for ref in refs:
            slot = self._ahead_refs[ref][1]
            by_slot.setdefault(slot.name, (slot, []))[1].append(ref)
        asked = {}
        for slot, mine in by_slot.values():
            asked[slot.handle.withdraw.remote([self._ahead_ids[r] for r in mine])] = mine
        done, _ = ray.wait(list(asked), num_returns=len(asked), timeout=WITHDRAW_TIMEOUT_S) if asked else ([], [])
        for answer in done:
            try:
                withdrawn = set(ray.get(answer))
            except ray.exceptions.RayError:  # the actor died: its batches are lost when collected
                continue
            for ref in asked[answer]:
                if self._ahead_ids.get(ref) in withdrawn:
                    batch, _, _ = self._drop_ahead(ref)
                    self.stats.ahead_cancelled += batch.size

    def cancel_ahead(self, labels: Any) -> None:
        """Models that left (``labels``) stop consuming: their batches sent ahead are withdrawn where an actor has
        not begun them (one begun finishes, and is kept and reported like any other)."""
        gone = set(labels)
        refs = [ref for ref, (batch, _, _) in self._ahead_refs.items()
                if all(label in gone for label, _, _ in batch.parts)]
        if refs:
            self._withdraw(refs)

    def settle(self) -> dict[str, Any]:
        """The run is decided: batches sent ahead that no actor has begun are withdrawn; those begun are awaited
        (each within ``batch_timeout_s`` of the last, else counted lost) and kept: the actors cached their scores.
        Returns what proposing ahead cost: items sent ahead, used by a round, scored but never used (per model),
        withdrawn before scoring (``cancelled``) or lost. The scored ones equal what the actors cached beyond the
        rounds' items."""
        if self._ahead_refs:
            self._withdraw(list(self._ahead_refs))
        pending = list(self._ahead_refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=self.options.batch_timeout_s)
            if not done:  # a hung batch: the run's answer stands; what it held is counted lost
                for ref in pending:
                    batch, _, _ = self._drop_ahead(ref)
                    self.stats.ahead_lost += batch.size
                break
            self._collect_ahead(done[0])
        unused: dict[str, int] = {}
        for label, _ in self._ahead_done:
            unused[label] = unused.get(label, 0) + 1
        stats = self.stats
        return {"sent": stats.ahead_sent, "used": stats.ahead_used, "scored_unused": sum(unused.values()),
                "scored_unused_per_model": unused, "cancelled": stats.ahead_cancelled, "lost": stats.ahead_lost,
                "sent_per_model": dict(stats.ahead_sent_per_model)}
