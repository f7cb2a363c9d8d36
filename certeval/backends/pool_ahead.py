"""The pool's half of proposing ahead: the next round's requests sent while the controller decides, collected
when a round asks for them, cancelled for models that left, and settled (scored but never used) at the end.
Split from :mod:`certeval.backends.pool`."""

from __future__ import annotations

from typing import Any

import ray


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
                ref = slot.handle.score.remote(batch.parts, False)
                self._ahead_refs[ref] = (batch, slot, slot.generation)
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
        batch, slot, generation = self._ahead_refs.pop(ref)
        self._ahead_load[slot.name] = max(0, self._ahead_load.get(slot.name, 0) - 1)
        for label, _, keys in batch.parts:
            for key in keys:
                if self._ahead_key.get((label, key)) is ref:
                    del self._ahead_key[(label, key)]
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
        for (label, _, keys), results in zip(batch.parts, results_per_part):
            for key, result in zip(keys, results):
                self._ahead_done[(label, key)] = result
        return True

    def cancel_ahead(self, labels: Any) -> None:
        """Models that left (``labels``) stop consuming: their batches sent ahead are cancelled where an actor has
        not started them (a started one finishes, and is kept and reported like any other)."""
        gone = set(labels)
        for ref, (batch, _, _) in list(self._ahead_refs.items()):
            if all(label in gone for label, _, _ in batch.parts):
                self._end_ahead(ref)

    def _end_ahead(self, ref: Any) -> None:
        if ray.wait([ref], timeout=0)[0]:
            self._collect_ahead(ref)
            return
        try:
            ray.cancel(ref)
        except Exception:  # already finished or gone: nothing left to stop
            pass
        batch, slot, _ = self._ahead_refs.pop(ref)
        self._ahead_load[slot.name] = max(0, self._ahead_load.get(slot.name, 0) - 1)
        for label, _, keys in batch.parts:
            for key in keys:
                if self._ahead_key.get((label, key)) is ref:
                    del self._ahead_key[(label, key)]
        self.stats.ahead_cancelled += batch.size

    def settle(self) -> dict[str, Any]:
        """The run is decided: batches sent ahead that finished are kept (the actors cached their scores), the
        rest are cancelled. Returns what proposing ahead cost: items sent ahead, used by a round, scored but
        never used (per model), cancelled or lost."""
        for ref in list(self._ahead_refs):
            self._end_ahead(ref)
        unused: dict[str, int] = {}
        for label, _ in self._ahead_done:
            unused[label] = unused.get(label, 0) + 1
        stats = self.stats
        return {"sent": stats.ahead_sent, "used": stats.ahead_used, "scored_unused": sum(unused.values()),
                "scored_unused_per_model": unused, "cancelled": stats.ahead_cancelled, "lost": stats.ahead_lost,
                "sent_per_model": dict(stats.ahead_sent_per_model)}
