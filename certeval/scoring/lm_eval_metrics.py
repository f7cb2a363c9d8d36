"""Every metric an lm-eval task lists that one run's requests give, each with an interval of its own.

lm-eval scores one multiple-choice doc with one set of log-likelihoods (one per choice) and reads ``acc``,
``acc_norm`` and ``acc_bytes`` off the same numbers (``ConfigurableTask.process_results``: the argmax of the
log-likelihoods; of the log-likelihoods over each choice's length in characters; over its length in UTF-8 bytes),
``exact_match`` off the gold choice's ``is_greedy``; a generated answer is judged by every (metric, filter) pair of
the task. A certeval run stops on one of them (the scorer's); the others come from the same requests at no cost:
the hosts answer a log-likelihood item with lm-eval's ``resps`` (``[[loglik, is_greedy], …]``, kept in the rounds
and the score cache), a generation item with its whole answer.

Intervals. The metric the run stopped on keeps the run's own interval. Another metric's scores on the same items
are fed to the same method with everything the method recorded about how the items were drawn (its draw log:
draw probabilities, controls and bets computed from the stopping metric's past, all predictable) and without the
stopping metric's accumulated evidence (``running`` / ``rejected``), replayed look by look where the method keeps
a running intersection: :func:`interval_on_same_draws`. Fed the stopping metric's own scores it gives exactly the
run's interval (``tests/test_lm_eval_metrics.py``). For an anytime-valid method it is again a confidence sequence
(the draws' laws are known and the controls predictable in the joint record), so it holds at any stopping time of
that record, the one the other metric chose included: runs of ``adaptive`` on 300 items stopped by one metric's
half-width of 0.1, a second metric agreeing on 80% of items was missed by its 95% interval in 27 of 650 runs
(4.2%) with three sub-datasets (the joint CS) and 1 of 200 without (the slow test repeats 200 of each). For a fixed-sample method it is labelled as not valid at a stop chosen by another metric's
scores. In a paired run it is the model's own interval (``--method``'s per-model one), not the group's
simultaneous claim.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from certeval.harnesses.lm_eval_output_types import (
    LOGLIKELIHOOD,
    REQUESTS,
    ROLLING,
    UNCERTIFIED,
    aggregate,
    output_type,
    per_doc_value,
)

RESPS = "resps"  # rounds column: JSON of lm-eval's responses to a log-likelihood item, [[loglik, is_greedy], ...]
_PACKED = "\x00certeval-resps\x00"  # a score cache's output that carries the item's resps too
LOGLIK_METRICS = ("acc", "acc_norm", "acc_bytes", "exact_match")  # per-item scores in [0, 1] from one set of lls


# ---------------------------------------------------------------------------------------- resps in the cache

def pack_output(output: str | None, resps: Any) -> str | None:
    """A host's output as the score cache keeps it: with the item's ``resps`` when it has them (a log-likelihood
    item), so a later run answered from the cache reads every metric off them too."""
    if resps is None:
        return output
    return _PACKED + json.dumps({"output": output, "resps": resps}, separators=(",", ":"))


def unpack_output(text: Any) -> tuple[str | None, str | None]:
    """(output, resps as JSON text or None) of a cached output (:func:`pack_output`; a plain text is an output)."""
    if not isinstance(text, str):
        return None, None
    if not text.startswith(_PACKED):
        return text, None
    packed = json.loads(text[len(_PACKED):])
    return packed["output"], resps_text(packed["resps"])


def resps_text(resps: Any) -> str | None:
    return None if resps is None else json.dumps(resps, separators=(",", ":"))


# ---------------------------------------------------------------------------------------- per-item scores

def loglik_scores(metric: str, resps: list[list[Any]], choices: list[str], gold: int | list[int]) -> float | None:
    """lm-eval's per-item value of ``metric`` from one multiple-choice doc's (loglik, is_greedy) pairs and its gold
    index, or gold indices (a task of several golds: right when the prediction is one of them, ``exact_match`` when
    any gold is greedy); None when the pairs do not give it (``exact_match`` without is_greedy)."""
    golds = [int(g) for g in gold] if isinstance(gold, (list, tuple)) else [int(gold)]
    lls = np.asarray([float(r[0]) for r in resps], dtype=float)
    if metric == "acc":
        return float(int(np.argmax(lls)) in golds)
    if metric == "acc_norm":
        return float(int(np.argmax(lls / np.array([float(len(c)) for c in choices]))) in golds)
    if metric == "acc_bytes":
        return float(int(np.argmax(lls / np.array([float(len(c.encode("utf-8"))) for c in choices]))) in golds)
    if metric == "exact_match":
        greedy = [resps[g][1] for g in golds]
        return None if any(g is None for g in greedy) else float(any(bool(g) for g in greedy))
    return None


Pair = tuple[str, str]  # (metric, filter), as lm-eval's results key them: "<metric>,<filter>"


def task_metas(frame: pd.DataFrame | None) -> list[dict[str, Any]]:
    """The distinct task descriptions of a bank built from lm-eval tasks (:data:`~certeval.harnesses.lm_eval_tasks.TASK_META`),
    in the bank's order; empty for any other bank."""
    from certeval.harnesses.lm_eval_tasks import TASK_META

    if frame is None or TASK_META not in frame.columns:
        return []
    return [json.loads(text) for text in dict.fromkeys(frame[TASK_META].dropna().astype(str))]


def listed_pairs(frame: pd.DataFrame | None, primary: Pair, kind: str) -> tuple[list[Pair], dict[Pair, str]]:
    """The (metric, filter) pairs the bank's lm-eval tasks list that a run's requests give — the run's own first —
    and those listed that they cannot give, with why. ``kind`` is the scorer's (``loglik`` / ``generate``)."""
    from .lm_eval_generation import SCORING, pairs

    metas = task_metas(frame)
    wanted: list[Pair] = []
    if metas:
        names = [[m["metric"] for m in meta["metrics"]] for meta in metas]
        common = [n for n in names[0] if all(n in other for other in names[1:])]
        filters = [f for f in metas[0]["filters"] if all(f in meta["filters"] for meta in metas[1:])]
        wanted = [(m, f) for f in filters for m in common]
    cannot: dict[Pair, str] = {}
    given: list[Pair] = []
    if kind == "loglik":
        for metric, filt in wanted:
            if filt != "none":
                cannot[(metric, filt)] = f"filter {filt!r} on log-likelihoods is not one certeval applies"
            elif metric in UNCERTIFIED:
                cannot[(metric, filt)] = f"not certified: {UNCERTIFIED[metric]}; its value is in metrics_uncertified"
            elif metric not in LOGLIK_METRICS:
                cannot[(metric, filt)] = ("not a per-item score in [0, 1] read off the log-likelihoods "
                                          f"({', '.join(LOGLIK_METRICS)} are)")
            else:
                given.append((metric, filt))
    elif kind == "mixed":  # tasks of several output types: their metrics per task (tasks.results._task_metrics)
        pass
    elif frame is not None and SCORING in frame.columns and len(frame):
        judged = [pairs(row) for row in frame[[SCORING]].drop_duplicates().to_dict("records")]
        common_pairs = [p for p in judged[0] if all(p in other for other in judged[1:])]
        given = [p for p in common_pairs if not wanted or p in wanted]
    return [primary] + [p for p in given if p != primary], cannot


def item_scores(pair: Pair, rounds: pd.DataFrame, frame: pd.DataFrame, kind: str) -> dict[str, float] | str:
    """``item_id -> score`` of one model's scored items under ``pair``, read off the run's stored answers (a
    log-likelihood item's resps, a generated answer); a sentence saying why when some item's answer is missing."""
    from .lm_eval_generation import judge
    from .scorers import as_list, gold_indices

    out: dict[str, float] = {}
    column = RESPS if kind == "loglik" else "output"
    if column not in rounds.columns or rounds[column].isna().any():
        return ("a scored item has no stored log-likelihoods (answered from a score cache written before they were "
                "kept, or recorded scores replayed)" if kind == "loglik" else
                "a scored item has no stored answer (recorded scores replayed)")
    wanted = set(rounds["item_id"].astype(str))
    rows = {str(rec["item_id"]): rec for rec in frame[frame["item_id"].astype(str).isin(wanted)].to_dict("records")}
    for item_id, value in zip(rounds["item_id"].astype(str), rounds[column]):
        item = rows[item_id]
        if kind == "loglik" and output_type(item) in (LOGLIKELIHOOD, ROLLING):  # LAMBADA / perplexity docs
            score = per_doc_value(pair[0], json.loads(value), item)
            if not isinstance(score, float):
                return f"{pair[0]} is not a per-item score of a {output_type(item)} doc"
        elif kind == "loglik":
            choices = [str(c) for c in as_list(item.get("choices"))]
            score = loglik_scores(pair[0], json.loads(value), choices, gold_indices(item))
            if score is None:
                return f"the model host gave no is_greedy for {pair[0]}"
        else:
            score = judge(str(value), item, pair)
        out[item_id] = float(score)
    return out


def uncertified_metrics(rounds: Any, frame: Any) -> dict[str, dict[str, Any]]:
    """lm-eval's aggregates of the metrics certeval reports but does not certify (``harnesses.lm_eval_output_types.UNCERTIFIED``)
    over one model's scored docs (``rounds``: item_id, resps), for the metrics the bank's tasks list:
    ``{"<metric>,none": {"value", "n_scored", "certified": False, "why"}}``; the corpus's own value when every doc
    was scored."""
    if frame is None or REQUESTS not in frame.columns or RESPS not in rounds.columns or not len(rounds):
        return {}
    listed = [m["metric"] for meta in task_metas(frame) for m in meta["metrics"] if m["metric"] in UNCERTIFIED]
    rows = frame.set_index(frame["item_id"].astype(str))
    out = {}
    for metric in dict.fromkeys(listed):
        values = []
        for item_id, resps in zip(rounds["item_id"].astype(str), rounds[RESPS]):
            if resps is None or (isinstance(resps, float) and math.isnan(resps)) or item_id not in rows.index:
                continue
            value = per_doc_value(metric, json.loads(resps), rows.loc[item_id].to_dict())
            if value is not None:
                values.append(value)
        if values:
            out[f"{metric},none"] = {"value": aggregate(metric, values), "n_scored": len(values), "certified": False,
                                     "why": UNCERTIFIED[metric]}
    return out


# ---------------------------------------------------------------------------------------- intervals

SCORE_EVIDENCE = ("running", "rejected")  # a method state's accumulated evidence about the scores it was fed
MAX_REPLAYED_LOOKS = 64  # looks an other metric's interval is intersected over (the latest; the final always)


def interval_on_same_draws(state: dict[str, Any], scores_at: dict[int, float], looks: list[int] | None = None) -> Any:
    """The estimate the method of ``state`` gives another metric's scores on the same draws (module docstring):
    ``scores_at`` maps each bank position in the state's order to the other metric's score. ``looks`` (items
    absorbed after each look, ascending) replays the run's looks: an anytime-valid method's interval is then
    intersected over them, as the run's own is (its running intersection)."""
    from dataclasses import replace

    from certeval.estimators import method_from_state

    order = [int(p) for p in state["order"]]
    extra = {k: v for k, v in (state.get("extra") or {}).items() if k not in SCORE_EVIDENCE}

    def at(k: int) -> Any:
        swapped = {**state, "order": order[:k], "scores": [float(scores_at[p]) for p in order[:k]], "extra": extra}
        return method_from_state(swapped).result()

    final = at(len(order))
    cuts = sorted({int(k) for k in looks or [] if 0 < int(k) < len(order)})
    # only a state that keeps a running intersection over its looks needs them replayed (a method whose evidence
    # is a rejection set accumulated item by item has it all in the final replay)
    if not final.anytime_valid or not cuts or "running" not in (state.get("extra") or {}):
        return final
    if len(cuts) > MAX_REPLAYED_LOOKS:  # any set of times keeps a confidence sequence valid: the latest ones
        cuts = cuts[-MAX_REPLAYED_LOOKS:]
    lower, upper = final.lower, final.upper
    for k in cuts:
        est = at(k)
        lower, upper = max(lower, est.lower), min(upper, est.upper)
    return replace(final, lower=lower, upper=upper, mean=min(max(final.mean, lower), upper))


def other_interval_text(est: Any, metric: str, stopped_on: str, paired: bool) -> str:
    """What another metric's interval is, in one sentence (results.json and the report)."""
    text = (f"the run's method ({est.method}) fed {metric}'s scores on the same draws, at the stop {stopped_on} "
            "decided: ")
    text += ("anytime-valid, so valid at that stop" if est.anytime_valid else
             "a fixed-sample method, not valid at a stop chosen by another metric's scores")
    if paired:
        text += "; the model's own interval, not the group's simultaneous claim"
    return text
