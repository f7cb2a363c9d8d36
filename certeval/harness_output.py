"""Results in lm-evaluation-harness's own shapes: the per-model results block and ``--log_samples`` files.

lm-eval writes one ``results_<timestamp>.json`` per model with ``results`` (``{task: {"alias": …,
"<metric>,<filter>": number, "<metric>_stderr,<filter>": number | "N/A"}}``), ``versions``, ``n-shot``,
``n-samples`` (``{"original": N, "effective": n}``), ``higher_is_better``, ``group_subtasks``, ``configs``
and ``config`` (``model``, ``model_args``, …). :func:`lm_eval_block` builds exactly that for one certeval model,
so lm-eval's table code (``lm_eval.utils.make_table``) prints it; every metric value is a number (the
interval as ``<metric>_ci_lower``/``<metric>_ci_upper``). The metric is named after what was judged
(:func:`metric_name`: lm-eval's ``acc``/``acc_norm``/``exact_match`` for the scorers that are those; ``score`` for
recorded scores, whose metric the run does not know). The guarantee, confidence and decision stay in certeval's
own entry of the model in ``results.json``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from .backends.base import parse_model_spec
from .lm_eval_scoring import GENERATION, SCORING, is_lm_eval_scorer, parse_choice
from .storage import Folder, dumps, safe_name

FILTER = "none"


def model_config(spec_text: str) -> dict[str, Any]:
    """lm-eval's ``config.model`` / ``config.model_args`` for a certeval model spec (an ``hf`` / ``vllm`` model's
    folder as lm-eval's ``pretrained=``, so lm-eval's tooling and ``certeval import lm-eval`` name it alike)."""
    spec = parse_model_spec(spec_text)
    where = "pretrained" if spec.kind in ("hf", "vllm") else "location"
    args = [f"{where}={spec.location}"] + ([f"name={spec.name}"] if spec.name else [])
    args += [f"{k}={v}" for k, v in spec.options]
    return {"model": spec.kind, "model_args": ",".join(args)}


SCORER_METRICS = {"mc-loglik": "acc", "mc-loglik-norm": "acc_norm", "exact": "exact_match"}


def metric_name(scorer: str | None) -> str:
    """lm-eval's name for what a scorer judges (an lm-eval task's own metric for ``lm-eval:METRIC,FILTER``);
    ``score`` for a replay of recorded scores (scorer unknown)."""
    if not scorer or scorer == "auto":
        return "score"
    pair = _lm_eval_pair(scorer)
    return pair[0] if pair else SCORER_METRICS.get(scorer, scorer.replace("-", "_"))


def filter_name(scorer: str | None) -> str:
    """lm-eval's filter the metric was taken after: an lm-eval task's own for ``lm-eval:METRIC,FILTER``, else
    ``none`` (no filter)."""
    pair = _lm_eval_pair(scorer)
    return pair[1] if pair else FILTER


def _lm_eval_pair(scorer: str | None) -> tuple[str, str] | None:
    """(metric, filter) of a qualified ``lm-eval:METRIC,FILTER`` scorer; None for any other scorer."""
    return parse_choice(scorer) if is_lm_eval_scorer(scorer) else None


def results_metric_key(results: dict[str, Any]) -> tuple[str, str]:
    """(metric, filter) of a results.json's lm-eval blocks (``acc``, ``none`` for those written before metrics had
    names)."""
    for block in (results.get("results") or {}).values():
        for key in block:
            name, _, filt = key.partition(",")
            if filt and not name.startswith("items_") and not name.endswith(("_stderr", "_ci_lower", "_ci_upper")):
                return name, filt
    return "acc", FILTER


def results_metric(results: dict[str, Any]) -> str:
    """The metric name of a results.json's lm-eval blocks (``acc`` for those written before metrics had names)."""
    return results_metric_key(results)[0]


def _number(value: Any) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None


def task_block(task: str, *, mean: float, stderr: float, lower: float, upper: float, n_scored: int,
               n_total: int, metric: str = "score", filter_key: str = FILTER) -> dict[str, Any]:
    """One task's metrics in lm-eval's ``<metric>,<filter>`` form (numbers; stderr ``"N/A"`` when unknown,
    as lm-eval writes it)."""
    se, f = _number(stderr), filter_key
    return {"alias": task, f"{metric},{f}": _number(mean) if n_scored else None,
            f"{metric}_stderr,{f}": "N/A" if se is None else se,
            f"{metric}_ci_lower,{f}": _number(lower), f"{metric}_ci_upper,{f}": _number(upper),
            f"items_scored,{f}": int(n_scored), f"items_total,{f}": int(n_total)}


def lm_eval_block(task: str, label: str, spec_text: str, block: dict[str, Any], *, batch_size: int,
                  limit: int | None, seed: int, date: str | None = None, metric: str = "score",
                  aggregation: str = "mean") -> dict[str, Any]:
    """The whole lm-eval results file of one model (see the module docstring); ``aggregation`` names how the
    items were summed up, as lm-eval's ``metric_list`` does (``mean``, or ``mean_of_subset_means``)."""
    filt = next(key.partition(",")[2] for key in block if key.startswith("items_total,"))
    return {
        "results": {task: block},
        "group_subtasks": {task: []},
        "configs": {task: {"task": task, "num_fewshot": 0, "output_type": "certeval",
                           "metric_list": [{"metric": metric, "aggregation": aggregation,
                                            "higher_is_better": True}]}},
        "versions": {task: None},  # a certeval bank has no task version
        "n-shot": {task: 0},
        "higher_is_better": {task: {metric: True, f"{metric}_ci_lower": True, f"{metric}_ci_upper": True}},
        "n-samples": {task: {"original": block[f"items_total,{filt}"],
                             "effective": block[f"items_scored,{filt}"]}},
        "config": {**model_config(spec_text), "batch_size": batch_size, "limit": limit, "random_seed": seed},
        "model_name": label,
        "date": date,
    }


def _arguments(doc: dict) -> list[list[Any]]:
    """The requests an item stands for, as lm-eval records them: one (context, " " + choice) per choice of a
    multiple-choice item, else (context, generation arguments)."""
    context = doc.get("prompt") or doc.get("question")
    if not isinstance(context, str):
        return []
    choices = doc.get("choices")
    if isinstance(choices, list) and choices:
        return [[context, f" {choice}"] for choice in choices]
    settings = doc.get(GENERATION)  # an lm-eval task's generation request: its own settings
    return [[context, json.loads(settings) if isinstance(settings, str) and settings else {}]]


def _doc_and_target(row: dict) -> tuple[dict, Any]:
    """What lm-eval records as ``doc`` and ``target``: an lm-eval task item's own doc and gold, else the bank row
    and its answer."""
    scoring = row.get(SCORING)
    if isinstance(scoring, str) and scoring:
        parsed = json.loads(scoring)
        return parsed["doc"], parsed["gold"]
    return row, row.get("answer", row.get("answers"))


def write_samples(folder: Folder, results: dict[str, Any], rounds: pd.DataFrame, bank_frame: pd.DataFrame | None,
                  stamp: str) -> list[str]:
    """``--log_samples``: ``samples/<model>/samples_<task>_<stamp>.jsonl`` in the run folder, one line per
    scored item in scoring order, lm-eval's field names where they apply (``doc_id`` = position in the bank,
    ``doc``, ``target``, ``arguments``, ``resps``, ``filtered_resps``, the metric by its name); certeval adds
    ``item_id``, ``round`` and ``prob`` (selection probability). Beside them ``results_<stamp>.json``, the model's
    lm-eval results file (the certified interval as ``<metric>_ci_lower`` / ``_ci_upper``), so each folder is
    what ``lm_eval --output_path … --log_samples`` writes. The files read back as scores and history (lm-eval's
    layout: the folder names the model)."""
    task = str(results["task"])
    metric, filt = results_metric_key(results)
    docs: dict[str, dict] = {}
    position: dict[str, int] = {}
    if bank_frame is not None:
        position = {str(i): k for k, i in enumerate(bank_frame["item_id"].astype(str))}
        frame = bank_frame.drop(columns=[c for c in ("embedding",) if c in bank_frame.columns])
        docs = {str(r["item_id"]): r for r in json.loads(frame.to_json(orient="records"))}
    written = []
    for model, group in rounds.groupby("model", sort=False) if len(rounds) else []:
        lines = []
        for row in group.sort_values("round", kind="stable").itertuples(index=False):
            bank_row = docs.get(str(row.item_id), {"item_id": str(row.item_id)})
            doc, target = _doc_and_target(bank_row)
            output = getattr(row, "output", None)
            resps = [] if output is None or (isinstance(output, float) and math.isnan(output)) else [[str(output)]]
            lines.append(dumps({
                "doc_id": position.get(str(row.item_id), str(row.item_id)), "item_id": str(row.item_id), "doc": doc, "target": target,
                "arguments": _arguments(bank_row), "resps": resps, "filtered_resps": [r[0] for r in resps], "filter": filt,
                metric: float(row.score), "round": int(row.round),
                "prob": None if getattr(row, "prob", None) is None else float(row.prob)}, indent=None).decode())
        rel = f"samples/{safe_name(str(model))}/samples_{task}_{stamp}.jsonl"
        folder.write_bytes(rel, ("\n".join(lines) + "\n").encode())
        written.append(folder.url(rel))
        block = (results.get("lm_eval") or {}).get(str(model))
        if block is not None:
            folder.write_bytes(f"samples/{safe_name(str(model))}/results_{stamp}.json", dumps(block))
    return written
