"""results.json of a pipeline run, built from its look log (docs/architecture.md §5): every model's interval is the one the
run recorded at the model's last look; nothing here re-runs an estimator."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from certeval.errors import InputError
from certeval.estimators.results import Estimate
from certeval.harnesses.lm_eval_output import LmEvalRun, filter_name, lm_eval_block, metric_name, task_block
from certeval.harnesses.lm_eval_tasks import bank_request_options
from certeval.record.looks import last_looks
from certeval.record.results import RunResults
from certeval.scoring.lm_eval_metrics import (
    interval_on_same_draws,
    item_scores,
    listed_pairs,
    other_interval_text,
    task_metas,
    uncertified_metrics,
)

PAIRS_INLINE_MAX = 5000  # rank runs with more pairs write them to PAIRS_FILE instead of results.json
PAIRS_FILE = "pairs.parquet"


def run_results(run: Any) -> dict[str, Any]:
    """results.json of a :class:`~certeval.runs.run.Run`, built as the typed record
    :class:`~certeval.record.results.RunResults` (which checks every part) and written by it: ``models``
    (+ ``pairs``/``ranking``/``selection``) and
    lm-eval-style blocks. Every model's numbers are the look log's last entry (:mod:`certeval.record.looks`); the group's
    own objects (pairs, ranking, selection) are the engine's at the last look."""
    plan = run.plan
    models = []
    lm_eval = {}
    lm_eval_files = {}  # one lm-eval results file per model
    rounds = run.store.read_rounds()
    by_model = {m: g["score"].to_numpy(float) for m, g in rounds.groupby("model", sort=False)} if len(rounds) else {}
    looks = last_looks(rounds)  # every number below is the one recorded at the model's last look
    metric = metric_name(plan.scorer)  # lm-eval's name for what was judged ("score": recorded scores replayed)
    filt = filter_name(plan.scorer)
    kind = scorer_kind(plan.scorer)
    # every other metric the task lists that the same requests give (acc_norm beside acc, other filters)
    pairs, cannot = listed_pairs(run.bank.frame, (metric, filt), kind) if kind else ([(metric, filt)], {})
    metas = task_metas(run.bank.frame)
    aggregate = aggregate_of(run.spec)
    # what every model's lm-eval results file shares (--apply_chat_template, --gen_kwargs, ...: recorded as lm-eval does)
    lm_eval_run = LmEvalRun(plan.task_name, batch_size=plan.batch_size, limit=plan.max_items, seed=plan.seed,
                            aggregation=AGGREGATION[aggregate["name"]], metas=tuple(metas),
                            output_type=OUTPUT_TYPES.get(kind), requests=bank_request_options(plan.bank))
    claim = run.engine.group.interval_claim() if plan.paired else None
    for label, spec in zip(run.labels, plan.models):
        live: Estimate = run.methods[label].result()
        est, look = live, looks.get(label)
        shared = run.engine.intervals.get(label) if plan.paired else None
        if shared is not None:  # the model is shown with the group's interval: its live value, its claim
            live = replace(live, n_scored=int(shared[3]), mean=float(shared[0]), lower=float(shared[1]),
                           upper=float(shared[2]), **claim)
            est = live
        if look is not None:
            est = replace(live, n_scored=look.n_scored, mean=look.mean, lower=look.lower, upper=look.upper)
        scored = by_model.get(label, np.zeros(0))
        n, total = est.n_scored, run.bank.n_items
        finite = plan.paired or est.target == "bank"
        stderr = _stderr(scored, n, total, finite)
        others, not_reported = _other_metrics(run, label, rounds, pairs, kind, metric, finite)
        not_reported.update({f"{m},{f}": why for (m, f), why in cannot.items()})
        entry = {
            "model": label, "spec": spec, "mean": est.mean, "lower": est.lower, "upper": est.upper,
            "halfwidth": est.halfwidth, "n_scored": n, "n_total": total, "confidence": est.confidence,
            "method": est.method, "guarantee": est.guarantee, "anytime_valid": est.anytime_valid,
            "validity": est.validity, "items_sent_to_model": run.sent[label],
            # what the score cache holds this model's scores under (docs/architecture.md, "Score cache key")
            "score_cache": {"key": run.cache_keys[label], "covers": run.fingerprints[label].covers,
                            "fingerprint": run.fingerprints[label].digest,
                            "not_reused": run.cache_notes.get(label)},
            "decision": run.decisions[label].to_dict() if label in run.decisions else None,
            "estimate": live.to_dict(),  # the live estimator's (tests: equal to the look log's)
        }
        if label in run.history:
            entry["history"] = run.history[label].describe()
        entry["metric"] = f"{metric},{filt}"  # what the run stopped on: the interval above
        uncertified = uncertified_metrics(rounds[rounds["model"] == label] if len(rounds) else rounds,
                                          run.bank.frame)
        if others or not_reported:
            entry["metrics"] = {f"{o['metric']},{o['filter']}": o for o in others}
            entry["metrics_not_reported"] = not_reported
        if uncertified:  # lm-eval's perplexities over the scored docs: values, no interval (lm_eval_output_types)
            entry["metrics_uncertified"] = uncertified
        if kind == "mixed":  # tasks of several output types: every metric of each task, with its interval
            entry["task_metrics"] = _task_metrics(run, label, rounds, est.target == "bank")
        # lm-eval's shapes (numbers only); the guarantee and confidence are in the entry itself
        stopped_on = {"metric": metric, "filter": filt, "mean": est.mean, "stderr": stderr, "lower": est.lower,
                      "upper": est.upper}
        block = task_block(plan.task_name, [stopped_on, *others], n_scored=n, n_total=total, confidence=est.confidence)
        block.update({k: v for key, u in uncertified.items()
                      for k, v in ((key, u["value"]), (key.replace(",", "_stderr,", 1), "N/A"))})
        entry["results"] = {plan.task_name: block}
        lm_eval[plan.task_name if len(run.labels) == 1 else f"{plan.task_name}|{label}"] = block
        lm_eval_files[label] = lm_eval_block(lm_eval_run, label, spec, block,
                                             date=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()))
        models.append(entry)
    group = run.engine.outcome if plan.paired else None  # Comparison / Ranking / Selection
    if plan.kind == "select" and group is not None:
        status = {s.model: s.status for s in group.models}
        for entry in models:
            entry["selection_status"] = status[entry["model"]]
    kinds: dict[str, Any] = {}  # the fields only some kinds have (RunResults: absent otherwise)
    if plan.kind == "compare" and group is not None:
        kinds["pairs"] = [group]
    if plan.kind == "rank" and group is not None:
        kinds["ranking"] = group.to_dict(comparisons=False)
        if len(group.pairs) <= PAIRS_INLINE_MAX:
            kinds["pairs"] = list(group.comparisons)
        else:  # millions of pairs: a Parquet table next to results.json
            run.store.folder.write_parquet(PAIRS_FILE, pd.DataFrame(group.pairs.columns()))
            kinds["pairs"] = None
            kinds["pairs_file"] = run.store.folder.url(PAIRS_FILE)
    if plan.kind == "select" and group is not None:
        kinds["selection"] = group.to_dict()
    record = RunResults(
        run_id=plan.run_id, kind=plan.kind, task=plan.task_name, bank=plan.bank,
        target=run._target(),
        confidence=plan.confidence, seed=plan.seed, rounds=run.round,
        done=all(d.done for d in run.decisions.values()) if run.decisions else False,
        reached=all(d.reached for d in run.decisions.values()) if run.decisions else False,
        aggregate=aggregate,
        models=models, results=lm_eval, lm_eval=lm_eval_files,
        history=None if not plan.history else {
            "sources": list(plan.history),
            "comparison_target": "bank" if plan.paired and run._target() == "bank" else None,
            "rule": "the model under evaluation is never part of its own history (same name: left out)"},
        config={"goal": plan.goal, "method": plan.method, "batch_size": plan.batch_size,
                "max_items": plan.max_items, "margin": plan.margin, "threshold": plan.threshold,
                "halfwidth": plan.halfwidth, "mode": plan.mode if plan.kind == "select" else None,
                "target": plan.target, "top": plan.top, "epsilon": plan.epsilon},
        run_folder=run.store.url,
        pipeline={"resumed": run.resumed, "items_sent": dict(run.sent),
                  "ray_address": plan.ray_address or "local",
                  "wall_s": round(time.time() - run.started, 2),
                  "batches": getattr(run.pool_stats, "batches", 0),
                  "batches_resubmitted": getattr(run.pool_stats, "resubmitted", 0),
                  "actors_replaced": getattr(run.pool_stats, "replaced_actors", 0),
                  # which Ray node each model actor ran on (replacements after a node loss included)
                  "placement": list(getattr(run.pool_stats, "placement", [])),
                  # models that shared an actor because the cluster had too few CPUs for one each
                  "shared_actors": dict(getattr(run.pool_stats, "shared", {})),
                  # the next round's items queued while the controller decided: items scored vs items used
                  "ahead": _ahead_report(run),
                  "phases": _phases(run)},
        **kinds,
    )
    return record.to_json()


def _phases(run: Any) -> dict[str, float | None]:
    """Where the command's time went, in seconds (docs/pipeline.md, "phases"): start-up (the command's start — the
    interpreter, or the flow where no CLI ran it — to the first round), the longest model load (inside start-up when
    the models load beside the services), and the rounds' time split into waiting for model scores (``rounds_s``),
    the controller's selection, update and decision (``controller_s``) and writing rounds, state and results
    (``storage_s``); ``report_s`` is filled in by the CLI once report.md is written."""
    from certeval.runtime.startup import seen, times_seen

    # the process's start is this command's only for its first flow (a served deployment or the demo runs several)
    began = (seen("interpreter") if times_seen("flow_started") <= 1 else None) or run.started
    loads = [p["load_s"] for p in getattr(run.pool_stats, "placement", []) or [] if p.get("load_s") is not None]
    return {"startup_s": None if run.first_round_at is None else round(run.first_round_at - began, 3),
            "model_load_s": max(loads) if loads else None,
            **{f"{phase}_s": round(value, 3) for phase, value in run.phase_s.items()},
            "report_s": None}


def record_report_phase(store: Any, results: dict[str, Any], seconds: float) -> None:
    """The report's time (report.md and plots, written after results.json) into ``pipeline.phases.report_s`` of
    ``results`` and of the stored results.json."""
    value = round(seconds, 3)
    for record in (results, store.read_results()):
        phases = ((record or {}).get("pipeline") or {}).get("phases")
        if phases is not None:
            phases["report_s"] = value
            if record is not results:
                store.write_results(record)


def _ahead_report(run: Any) -> dict[str, Any] | None:
    """Proposing ahead's account (None when the run did not): items sent ahead of their round, used by a round,
    scored and never used (kept in the score cache), cancelled; per model, the items scored (items sent plus
    those scored ahead and never used) beside the items its statistics used."""
    ahead = getattr(run, "ahead", None)
    if not ahead:
        return None
    unused = ahead.get("scored_unused_per_model", {})
    per_model = {label: {"scored": int(run.sent.get(label, 0)) + int(unused.get(label, 0)),
                         "used": int(run.methods[label].n_scored) if label in run.methods else None}
                 for label in run.labels}
    return {**ahead, "items": per_model}


AGGREGATION = {"mean": "mean", "subset-mean": "mean_of_subset_means"}  # in lm-eval's metric_list
OUTPUT_TYPES = {"loglik": "multiple_choice", "generate": "generate_until"}  # lm-eval's, for a bank of no task


def scorer_kind(scorer: str | None) -> str | None:
    """``loglik`` / ``generate`` for the run's scorer; None for recorded scores (or a scorer not importable)."""
    from certeval.scoring.scorers import get_scorer

    if not scorer or scorer == "auto":
        return None
    try:
        return get_scorer(scorer, allow_import=False).kind
    except InputError:
        return None


def _stderr(scored: np.ndarray, n: int, total: int, finite: bool) -> float:
    """The descriptive standard error of the scored items' mean (lm-eval's ``_stderr``), with the finite-population
    correction where the estimand is the bank's own mean."""
    if n <= 1 or len(scored) <= 1:
        return float("nan")
    fpc = max(0.0, 1.0 - n / total) if finite else 1.0
    return float(np.std(scored, ddof=1) / math.sqrt(n) * math.sqrt(fpc))


def _other_metrics(run: Any, label: str, rounds: pd.DataFrame, pairs: list, kind: str | None, stopped_on: str,
                   finite: bool) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The task's other metrics for one model, each read off the run's stored answers, with the run's method fed
    their scores on the same draws (:mod:`certeval.scoring.lm_eval_metrics`); and those that could not be, with why."""
    others: list[dict[str, Any]] = []
    missing: dict[str, str] = {}
    if len(pairs) < 2 or run.bank.frame is None:
        return others, missing
    mine = rounds[rounds["model"] == label] if len(rounds) else rounds
    method = run.methods.get(label)
    if method is None or not len(mine) or method.n_scored == 0:
        return others, missing
    state = method.state()
    looks = np.cumsum(mine.groupby("round", sort=True).size().to_numpy()).tolist()  # items after each look
    for metric, filt in pairs[1:]:
        key = f"{metric},{filt}"
        scores = item_scores((metric, filt), mine, run.bank.frame, kind)
        if isinstance(scores, str):
            missing[key] = scores
            continue
        positions = run.bank.positions(list(scores))
        at = dict(zip(positions.tolist(), scores.values()))
        if not set(int(p) for p in state["order"]) <= set(at):
            missing[key] = "the method's draws are not the stored rounds' items"
            continue
        est = interval_on_same_draws(state, at, looks)
        values = np.fromiter(scores.values(), dtype=float)
        others.append({
            "metric": metric, "filter": filt, "mean": est.mean, "lower": est.lower, "upper": est.upper,
            "halfwidth": est.halfwidth, "stderr": _stderr(values, len(values), run.bank.n_items, finite),
            "n_scored": est.n_scored, "confidence": est.confidence, "method": est.method,
            "anytime_valid": est.anytime_valid, "guarantee": est.guarantee,
            "interval": other_interval_text(est, metric, stopped_on, run.plan.paired)})
    return others, missing


def _task_metrics(run: Any, label: str, rounds: pd.DataFrame, bank_target: bool) -> dict[str, dict[str, Any]]:
    """A mixed run's metrics per task (``{task: {"<metric>,<filter>": entry}}``): each per-item metric its task
    lists, read off the stored answers of the task's items. Its interval: the run's method fed the score
    ``s = metric`` on the task's items and 0 on the others, on the same draws (:func:`interval_on_same_draws`),
    scaled to the task's mean — by ``K`` (sub-datasets) when the estimand is the mean of the tasks' means
    (``s``'s mean of sub-dataset means is the task's mean over ``K``), by ``N / N_task`` for the bank's own mean;
    a distribution-target mean over all items has no known task share, so no interval there (why given)."""
    from certeval.harnesses.lm_eval_output_types import UNCERTIFIED
    from certeval.scoring.lm_eval_metrics import LOGLIK_METRICS

    out: dict[str, dict[str, Any]] = {}
    mine = rounds[rounds["model"] == label] if len(rounds) else rounds
    method, frame = run.methods.get(label), run.bank.frame
    if method is None or not len(mine) or method.n_scored == 0 or frame is None:
        return out
    state = method.state()
    looks = np.cumsum(mine.groupby("round", sort=True).size().to_numpy()).tolist()
    subsets = frame["subset"].astype(str)
    k = int(subsets.nunique())
    stratified = bool(run.spec.mean_of_means) and k > 1
    for meta in task_metas(frame):
        task = meta["task"]
        members = set(frame.loc[subsets == task, "item_id"].astype(str))
        theirs = mine[mine["item_id"].astype(str).isin(members)]
        kind = "generate" if meta["output_type"] == "generate_until" else "loglik"
        if kind == "generate":
            from certeval.scoring.lm_eval_generation import SCORING, pairs

            wanted = pairs(frame.loc[subsets == task].iloc[0].to_dict()) if SCORING in frame.columns else []
        else:  # a perplexity task: certeval's certified byte likelihood first, then lm-eval's ratios
            wanted = [("byte_likelihood", "none")] * (meta["output_type"] == "loglikelihood_rolling")
            wanted += [(m["metric"], "none") for m in meta["metrics"]]
        entries: dict[str, Any] = {}
        for metric, filt in wanted:
            key = f"{metric},{filt}"
            if metric in UNCERTIFIED or (kind == "loglik" and metric not in (*LOGLIK_METRICS, "byte_likelihood")):
                entries[key] = {"certified": False, "why": UNCERTIFIED.get(metric, "not a per-item score in [0, 1]")}
                continue
            scores = item_scores((metric, filt), theirs, frame, kind) if len(theirs) else {}
            if isinstance(scores, str):
                entries[key] = {"certified": False, "why": scores}
                continue
            every = {str(i): float(scores.get(str(i), 0.0)) for i in mine["item_id"].astype(str)}
            positions = run.bank.positions(list(every))
            at = dict(zip(positions.tolist(), every.values()))
            scale = k if stratified else (run.bank.n_items / max(1, len(members)) if bank_target else None)
            values = np.fromiter(scores.values(), dtype=float)
            entry = {"metric": metric, "filter": filt, "task": task, "n_scored": len(values),
                     "mean": float(values.mean()) if len(values) else None}
            if scale is None or not set(int(p) for p in state["order"]) <= set(at):
                entries[key] = {**entry, "certified": False, "why": "the estimand is a distribution's mean over all "
                                "items: the task's share of it is not known, so no interval for the task alone"}
                continue
            est = interval_on_same_draws(state, at, looks)
            entries[key] = {**entry, "certified": True, "lower": max(0.0, min(1.0, est.lower * scale)),
                            "upper": max(0.0, min(1.0, est.upper * scale)), "confidence": est.confidence,
                            "method": est.method, "anytime_valid": est.anytime_valid,
                            "interval": other_interval_text(est, metric, "the run's first metrics", run.plan.paired)
                            + f"; fed the metric on {task}'s items and 0 elsewhere, scaled by {scale:.6g}"}
        out[task] = entries
    return out


def aggregate_of(spec: Any) -> dict[str, Any]:
    """What the run's numbers are a mean of (``--aggregate``), named in results.json, the report and the console."""
    k = int(spec.n_subsets) if spec.subsets is not None else 1
    if k <= 1:
        return {"name": "mean", "subsets": k, "text": "the mean over the bank's items"}
    if spec.mean_of_means:
        return {"name": "subset-mean", "subsets": k,
                "text": f"the mean of the {k} sub-datasets' means (each sub-dataset counts once)"}
    return {"name": "mean", "subsets": k, "text": f"the mean over the items of all {k} sub-datasets (each item "
                                                  "counts once)"}
