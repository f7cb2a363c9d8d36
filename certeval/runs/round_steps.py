"""A pipeline run's round as the engine's loop (:func:`certeval.engine.play`) takes it (no Prefect here:
:class:`certeval.runs.steps.FlowSteps` makes each step a Prefect task)."""

from __future__ import annotations

from typing import Any


class RunSteps:
    """Each step a call on the :class:`~certeval.runs.run.Run` (benchmarks, rescore)."""

    def __init__(self, run: Any, pool: Any) -> None:
        self.run, self.pool = run, pool

    @property
    def done(self) -> bool:
        return self.run.done

    def select(self) -> Any:
        batch = self._select()
        return batch if any(len(items) for items in batch.items.values()) else None

    def _select(self) -> Any:
        return self.run.select()

    def infer(self, batch: Any) -> Any:
        return self.run.infer(self.pool, batch)

    def update(self, batch: Any) -> None:
        self.run.update(batch)

    def decide(self, batch: Any) -> None:
        self.run.decide(batch)

    def record(self, batch: Any) -> None:
        self.run.store_round(batch)
