"""Proposing ahead (``--propose-ahead``): a run's next round's items are queued while it updates and decides, so
a model is not idle between looks. Only a prediction: the next round selects as it always does and takes from
what was scored ahead only the items it selected (docs/architecture.md). Split from :mod:`certeval.tasks.run`."""

from __future__ import annotations

from typing import Any

import numpy as np


class ProposeAhead:
    """Mixed into :class:`certeval.tasks.run.Run` (its plan, engine, methods, round, rng and requests)."""

    def proposes_ahead(self, pool: Any) -> bool:
        """Whether this run queues the next round's items while it decides (``--propose-ahead``: ``auto`` when
        a model is not a replay of recorded scores, whose calls cost nothing to wait for)."""
        mode = getattr(self.plan.options, "propose_ahead", "auto")
        if mode == "off" or not getattr(pool, "supports_ahead", False):
            return False
        return mode == "on" or any(not spec.startswith("replay:") for spec in self.plan.models)

    def propose_ahead(self, batch: Any) -> dict[str, list[tuple[str, dict]]]:
        """The next round's requests as predicted before this round's scores arrive (docs/architecture.md, "proposing
        ahead"). A paired run's next items are the next slice of its shared order, fixed before any score, for
        every model in play now; a certify model's are what a copy of its method proposes now, with the
        generator the next round will use (:meth:`rng`). Only a prediction: the next round selects as it always
        does, after this round's update and decision, and takes from what was scored ahead only the items it
        selected; nothing scored ahead reaches a method, a look or a decision."""
        import copy

        items: dict[str, np.ndarray] = {}
        if self.plan.paired:
            engine = self.engine
            now = len(next(iter(batch.items.values()), ()))
            start, k = engine.n_shared + now, self.plan.batch_size
            if engine.max_items is not None:
                k = min(k, max(0, engine.max_items - start))
            chunk = engine.order[start:start + k].astype(np.int64)
            if len(chunk):
                items = {label: chunk for label in batch.items}
        else:
            for label, pos in batch.items.items():
                k = min(self.plan.batch_size, self.engine.budget_left(label) - len(pos))
                if k <= 0:
                    continue
                try:
                    peek = copy.deepcopy(self.methods[label]).propose(k, self.rng(self.round + 1))
                except Exception:  # a method that cannot be copied or asked twice: its next round is not predicted
                    continue
                if peek is not None and len(peek):
                    items[label] = np.asarray(peek.items, dtype=np.int64)
        requests, _ = self.requests(type(batch)(items, {}))
        return {label: reqs for label, reqs in requests.items() if reqs}

    def settle_ahead(self, pool: Any) -> None:
        """After the last round: what was scored ahead and never used is kept (the score cache) and reported."""
        if pool is not None and self.proposes_ahead(pool):
            self.ahead = pool.settle()
