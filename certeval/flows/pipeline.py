"""The ``certify``, ``compare``, ``rank`` and ``select`` flows: the round loop of docs/architecture.md §1, composed of tasks.

Each flow takes a validated :class:`~certeval.runs.plan.RunPlan` and returns the
content of ``results.json``. The four differ only in what the plan asks for
(the tasks branch on nothing but ``plan.kind``'s estimator); they are separate
flows so runs are named by their goal in Prefect's UI and deployments.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.utilities.annotations import quote

from certeval.runs import steps
from certeval.runs.inputs import PreparedRun
from certeval.runs.plan import RunPlan
from certeval.runtime.startup import configure, mark

from ..engine import play


def run_rounds(plan: RunPlan, progress: str | None = None, prepared: PreparedRun | None = None) -> dict[str, Any]:
    """bank → embed → restore → [select → infer → update → decide → store] per round until every goal is met.
    ``prepared``: what validation loaded and fitted in this process (None: loaded from the plan)."""
    if plan.options.startup_log:  # a flow run without the CLI (a deployment): its process names the timeline here
        configure(plan.options.startup_log)
    mark("flow_started")  # Prefect's API answered and the flow run exists
    run = steps.load_bank(plan, quote(prepared))
    mark("bank_loaded")
    pool = None
    try:
        steps.embed(quote(run))
        steps.restore(quote(run), progress)
        pool = steps.start_models(plan, quote(run)) if not run.done else None
        play(steps.FlowSteps(run, pool))
        run.settle_ahead(pool)  # batches sent ahead of a round the run never reached: kept or cancelled
        run.compact_cache()  # the batches' cache parts merged (bounded housekeeping, not a step of the loop)
        return steps.store_results(quote(run))
    finally:
        if pool is not None:
            steps.stop_models(quote(pool))
        if run.progress is not None:
            run.progress.close()
        if run.owns_lock:  # taken by this flow (not by a CLI around it): the next writer may come
            run.store.release_lock()


_FLOW = dict(validate_parameters=False, log_prints=False, persist_result=False)


@flow(name="certify", **_FLOW)
def certify_flow(plan: RunPlan, progress: str | None = None, prepared: PreparedRun | None = None) -> dict[str, Any]:
    """Certify each model's bank mean to a goal (half-width, or above / below a threshold)."""
    return run_rounds(plan, progress, prepared)


@flow(name="compare", **_FLOW)
def compare_flow(plan: RunPlan, progress: str | None = None, prepared: PreparedRun | None = None) -> dict[str, Any]:
    """Sequentially compare two models on the same items (group-sequential repeated CIs)."""
    return run_rounds(plan, progress, prepared)


@flow(name="rank", **_FLOW)
def rank_flow(plan: RunPlan, progress: str | None = None, prepared: PreparedRun | None = None) -> dict[str, Any]:
    """Rank models by sequential pairwise comparisons on shared items, with tie groups."""
    return run_rounds(plan, progress, prepared)


@flow(name="select", **_FLOW)
def select_flow(plan: RunPlan, progress: str | None = None, prepared: PreparedRun | None = None) -> dict[str, Any]:
    """Select models (discard the weak early; keep the best or those precise enough)."""
    return run_rounds(plan, progress, prepared)


FLOWS = {"certify": certify_flow, "compare": compare_flow, "rank": rank_flow, "select": select_flow}


def run_plan(plan: RunPlan, progress: str | None = None, prepared: PreparedRun | None = None) -> dict[str, Any]:
    """Run the flow for a plan's kind (``prepared``: from :func:`~certeval.runs.plan.make_plan`, same process)."""
    return FLOWS[plan.kind](plan, progress, prepared)
