"""Thin Prefect tasks, one per step per round (docs/architecture.md §1); each fans out inside.

Tasks take live handles (the :class:`~certeval.runs.run.Run`, the
:class:`~certeval.hosting.pool.ModelPool`), so none is cached or retried by
Prefect (``cache_policy=NONE``, ``retries=0``): a retried inference task could
score items twice, and resume is the pipeline's own business. Ray is called
directly from inside the tasks — prefect-ray's task runner adds a Ray round trip
a task and shuts Ray down at flow end, killing the model actors (docs/environment.md).
"""

from __future__ import annotations

import os
from typing import Any

from prefect import task
from prefect.cache_policies import NONE
from prefect.utilities.annotations import quote

from certeval.estimators.results import Decision
from certeval.runtime.startup import mark

from .inputs import PreparedRun
from .plan import RunPlan
from .round_steps import RunSteps
from .run import RoundScores, Run

_OPTS = dict(cache_policy=NONE, retries=0, persist_result=False, log_prints=False)


@task(name="load-bank", **_OPTS)
def load_bank(plan: RunPlan, prepared: PreparedRun | None = None) -> Run:
    """The bank and priors validation prepared (loaded here when none was), the claimed run folder, the score
    cache."""
    return Run.open(plan, prepared)


@task(name="embed", **_OPTS)
def embed(run: Run) -> None:
    """Item features for methods that partition by embeddings (no-op for the others)."""
    run.embed()


@task(name="restore", **_OPTS)
def restore(run: Run, progress: bool = False) -> None:
    """Methods fresh or from their stored state; the round to continue from."""
    run.restore(progress)


@task(name="start-models", **_OPTS)
def start_models(plan: RunPlan, run: Run) -> Any:
    """Start (or connect to) Ray and one named actor pool per model."""
    from certeval.hosting.ray_setup import init_ray

    mark("models_starting")
    if run.progress is not None:
        run.progress.status("starting Ray + model hosts…")
    from certeval.services.fast_start import plan_pool, take_pool

    init_ray(plan.ray_address, num_cpus=plan.num_cpus or os.cpu_count() or 2)  # no-op when the CLI started it
    mark("ray_ready")
    cache_urls = {label: cache.folder.url() for label, cache in run.caches.items()}
    pool = take_pool(plan, cache_urls)  # actors the CLI already set off (certeval.services.fast_start)
    if pool is None:
        pool = plan_pool(plan, cache_urls)
    started = pool.start()
    mark("actors_ready")
    if run.progress is not None:
        run.progress.status(None)
    return started


@task(name="select", **_OPTS)
def select(run: Run) -> RoundScores:
    return run.select()


@task(name="infer", **_OPTS)
def infer(run: Run, pool: Any, batch: RoundScores) -> RoundScores:
    return run.infer(pool, batch)


@task(name="update", **_OPTS)
def update(run: Run, batch: RoundScores) -> None:
    run.update(batch)


@task(name="decide", **_OPTS)
def decide(run: Run, batch: RoundScores) -> dict[str, Decision]:
    return run.decide(batch)


@task(name="store-round", **_OPTS)
def store_round(run: Run, batch: RoundScores) -> None:
    run.store_round(batch)


@task(name="store-results", **_OPTS)
def store_results(run: Run) -> dict[str, Any]:
    return run.results()


@task(name="stop-models", **_OPTS)
def stop_models(pool: Any) -> None:
    pool.shutdown()


class FlowSteps(RunSteps):
    """:class:`RunSteps` with each step a Prefect task. Live handles go to the tasks quoted: Prefect otherwise
    walks every argument to record task inputs, and a round's RoundScores (a dataclass of per-model arrays and
    outputs) cost it ~60 s over a 1,989-model ranking (benchmarks/scale.py profile)."""

    def _select(self) -> RoundScores:
        return select(quote(self.run))

    def infer(self, batch: RoundScores) -> RoundScores:
        return infer(quote(self.run), quote(self.pool), quote(batch))

    def update(self, batch: RoundScores) -> None:
        update(quote(self.run), quote(batch))

    def decide(self, batch: RoundScores) -> None:
        decide(quote(self.run), quote(batch))

    def record(self, batch: RoundScores) -> None:
        store_round(quote(self.run), quote(batch))
