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

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from certeval.inputs.model_spec import parse_model_spec
from certeval.record.results import ModelResult, RunResults
from certeval.scoring.lm_eval_generation import (
    GENERATION,
    SCORING,
    filtered,
    is_lm_eval_scorer,
    judge,
    pairs,
    parse_choice,
)
from certeval.scoring.lm_eval_metrics import RESPS, item_scores, task_metas
from certeval.storage import Folder, dumps, safe_name

from . import lm_eval_output_types
from .lm_eval_requests import RequestOptions
from .lm_eval_tasks import DOC as TASK_DOC
from .lm_eval_tasks import TASK_META

FILTER = "none"


def model_config(spec_text: str) -> dict[str, Any]:
    """lm-eval's ``config.model`` / ``config.model_args`` for a certeval model spec (an ``hf`` / ``vllm`` model's
    folder as lm-eval's ``pretrained=``, so lm-eval's tooling and ``certeval import lm-eval`` name it alike)."""
    spec = parse_model_spec(spec_text)
    where = "pretrained" if spec.kind in ("hf", "vllm") else "location"
    args = [f"{where}={spec.location}"] + ([f"name={spec.name}"] if spec.name else [])
    args += [f"{k}={v}" for k, v in spec.options]
    return {"model": spec.kind, "model_args": ",".join(args)}


SCORER_METRICS = {"mc-loglik": "acc", "mc-loglik-norm": "acc_norm", "exact": "exact_match",
                  "greedy": "acc", "byte-likelihood": "byte_likelihood",
                  "lm-eval-task": "first_metric"}  # a mixed run: each item by its own task's first metric


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


def headline_alias(task: str, confidence: float | None) -> str:
    """The task's name in lm-eval's table, saying what its ``±`` column is: lm-eval's Stderr (the descriptive standard
    error), while the certified interval is the ``<metric>_ci_lower`` / ``_ci_upper`` rows below it."""
    if confidence is None:
        return task
    return f"{task} (± is the stderr; certified {confidence:.0%} interval: *_ci_lower, *_ci_upper)"


def task_block(task: str, metrics: Sequence[Mapping[str, Any]], *, n_scored: int, n_total: int,
               confidence: float | None = None) -> dict[str, Any]:
    """One task's metrics in lm-eval's ``<metric>,<filter>`` form (numbers; stderr ``"N/A"`` when unknown,
    as lm-eval writes it), each with its interval: ``metrics`` are the metric the run stopped on first, then the
    task's other metrics from the same requests, each ``{metric, filter, mean, stderr, lower, upper}``."""
    block: dict[str, Any] = {"alias": headline_alias(task, confidence)}
    for row in metrics:
        m, f, se = row["metric"], row["filter"], _number(row["stderr"])
        block.update({f"{m},{f}": _number(row["mean"]) if n_scored else None,
                      f"{m}_stderr,{f}": "N/A" if se is None else se,
                      f"{m}_ci_lower,{f}": _number(row["lower"]), f"{m}_ci_upper,{f}": _number(row["upper"])})
    for f in dict.fromkeys(row["filter"] for row in metrics):
        block.update({f"items_scored,{f}": int(n_scored), f"items_total,{f}": int(n_total)})
    return block


def _common(values: list[Any]) -> Any:
    """The one value every leaf task has, else None (lm-eval's propagation of n-shot to a group)."""
    return values[0] if values and all(v == values[0] for v in values) else None


@dataclass(frozen=True)
class LmEvalRun:
    """What every model's lm-eval results file of one run shares: the task, the run's batch size, item limit and
    seed (lm-eval's ``config``), how the items were summed up (``aggregation``, named as lm-eval's ``metric_list``
    does: ``mean``, or ``mean_of_subset_means``), and the bank's lm-eval tasks and request flags.

    ``metas`` are the bank's lm-eval tasks (:func:`certeval.harnesses.lm_eval_tasks.task_meta`): their versions,
    ``num_fewshot``, ``output_type`` and configs as lm-eval writes them (a group's leaves each under their own name,
    and the group under its own when they agree); a bank of no task has no version, 0 shots and the scorer's request
    type (``output_type``). ``requests``: the bank's request flags, recorded where and as lm-eval's command line
    records them (chat template, system instruction and their sha256, ``fewshot_as_multiturn`` at the top level;
    ``config.gen_kwargs``)."""

    task: str
    batch_size: int
    limit: int | float | None
    seed: int
    aggregation: str = "mean"
    metas: tuple[dict[str, Any], ...] = ()
    output_type: str | None = None
    requests: RequestOptions = field(default_factory=RequestOptions)


def lm_eval_block(run: LmEvalRun, label: str, spec_text: str, block: dict[str, Any],
                  date: str | None = None) -> dict[str, Any]:
    """The whole lm-eval results file of model ``label`` (see the module docstring): its task ``block``
    (:func:`task_block`) with what the run's files share (``run``)."""
    task, metas, aggregation = run.task, list(run.metas), run.aggregation
    settings, generation = run.requests.results_record()
    filt = next(key.partition(",")[2] for key in block if key.startswith("items_total,"))
    names = list(dict.fromkeys(key.partition(",")[0] for key in block
                               if "," in key and not key.startswith("items_")
                               and not key.partition(",")[0].endswith(("_stderr", "_ci_lower", "_ci_upper"))))
    higher = {m: True for m in names}
    for meta in metas:
        higher.update({e["metric"]: e.get("higher_is_better", True) for e in meta["metrics"] if e["metric"] in higher})
    versions = {meta["task"]: meta["version"] for meta in metas}
    n_shot = {meta["task"]: meta["num_fewshot"] for meta in metas}
    configs = {meta["task"]: _task_config(meta, aggregation) for meta in metas}
    if task not in configs:  # a bank of no task, or a group: its own entry
        kinds = [meta["output_type"] for meta in metas]
        configs[task] = {"task": task, "num_fewshot": _common(list(n_shot.values())) if metas else 0,
                         "output_type": _common(kinds) if metas else (run.output_type or "certeval"),
                         "metric_list": [{"metric": m, "aggregation": aggregation, "higher_is_better": higher[m]}
                                         for m in names]}
        versions[task] = _common(list(versions.values())) if metas else None
        shots = _common(list(n_shot.values())) if metas else 0
        if shots is not None:
            n_shot[task] = shots
    return {
        "results": {task: block},
        "group_subtasks": {task: [meta["task"] for meta in metas if meta["task"] != task]},
        "configs": configs,
        "versions": versions,
        "n-shot": n_shot,
        "higher_is_better": {task: {**higher, **{f"{m}_ci_{end}": higher[m] for m in names
                                                 for end in ("lower", "upper")}}},
        "n-samples": {task: {"original": block[f"items_total,{filt}"],
                             "effective": block[f"items_scored,{filt}"]}},
        "config": {**model_config(spec_text), "batch_size": run.batch_size, "limit": run.limit, **generation,
                   "random_seed": run.seed},
        "model_name": label,
        "date": date,
        **settings,
    }


def _task_config(meta: dict[str, Any], aggregation: str) -> dict[str, Any]:
    """lm-eval's dump of a task's config, its metric_list naming how certeval summed the items up."""
    config = dict(meta.get("config") or {"task": meta["task"]})
    config.setdefault("num_fewshot", meta["num_fewshot"])
    config.setdefault("output_type", meta["output_type"])
    config["metric_list"] = [{**entry, "aggregation": aggregation} for entry in
                             (config.get("metric_list") or [{"metric": m["metric"]} for m in meta["metrics"]])]
    return config


def _arguments(doc: dict) -> dict[str, dict[str, Any]]:
    """The requests an item stands for, as lm-eval's samples file records them (``{"gen_args_i": {"arg_0": context,
    "arg_1": …}}``): one (context, continuation) per choice of a multiple-choice item (its task's delimiter + the
    choice), else (context, generation arguments)."""
    context = doc.get("prompt") or doc.get("question")
    if not isinstance(context, str):
        return {}
    choices = doc.get("choices")
    own = lm_eval_output_types.parsed(doc)
    if own is not None:  # an lm-eval task's own requests (LAMBADA, perplexity, Winogrande-style)
        requests = own["requests"]
    elif isinstance(choices, list) and choices:
        continuations = doc.get("continuations")  # an lm-eval task item's own (its target_delimiter)
        if not (isinstance(continuations, list) and len(continuations) == len(choices)):
            continuations = [f" {choice}" for choice in choices]
        requests = [[context, continuation] for continuation in continuations]
    else:
        settings = doc.get(GENERATION)  # an lm-eval task's generation request: its own settings
        requests = [[context, json.loads(settings) if isinstance(settings, str) and settings else {}]]
    return {f"gen_args_{i}": {f"arg_{j}": arg for j, arg in enumerate(request)} for i, request in enumerate(requests)}


def _lm_eval_doc(row: dict) -> dict[str, Any] | None:
    """An lm-eval task item's doc_id, dataset row and target (:data:`certeval.harnesses.lm_eval_tasks.DOC`); None for a bank's
    own item."""
    text = row.get(TASK_DOC)
    return json.loads(text) if isinstance(text, str) and text else None


def _doc_and_target(row: dict) -> tuple[dict, Any]:
    """What lm-eval records as ``doc`` and ``target``: an lm-eval task item's dataset row and ``str(target)`` (an MC
    gold is its index, as lm-eval's ``doc_to_target`` gives it), else the bank row and its answer."""
    task_doc = _lm_eval_doc(row)
    if task_doc is not None:
        return task_doc["doc"], str(task_doc["target"])
    scoring = row.get(SCORING)
    if isinstance(scoring, str) and scoring:
        parsed = json.loads(scoring)
        return parsed["doc"], parsed["gold"]
    return row, row.get("answer", row.get("answers"))


def _hash(text: str) -> str:
    """lm-eval's ``hash_string``."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _sanitized(value: Any) -> Any:
    """lm-eval's ``sanitize_list``: every leaf of a response as text."""
    if isinstance(value, (list, tuple)):
        return [_sanitized(v) for v in value]
    return str(value)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _responses(bank_row: dict, output: Any, resps: Any, filt: str) -> tuple[list, list]:
    """(resps, filtered_resps) as lm-eval's samples file writes them: a log-likelihood item's ``[[loglik,
    is_greedy]]`` per choice, a generated answer before and after the task's filter ``filt``; a bank's own item
    (or a log-likelihood item answered before resps were kept) its output as ``[[output]]`` / ``[output]``."""
    if not _missing(resps):
        pairs = json.loads(resps)
        return [[_sanitized(pair)] for pair in pairs], [_sanitized(pair) for pair in pairs]
    if _missing(output):
        return [], []
    text = str(output)
    scoring = bank_row.get(SCORING)
    if isinstance(scoring, str) and scoring and filt in {f["name"] for f in json.loads(scoring)["filters"]}:
        return [[text]], [_sanitized(filtered(text, bank_row, filt))]
    return [[text]], [text]


def write_samples(folder: Folder, results: RunResults, rounds: pd.DataFrame, bank_frame: pd.DataFrame | None,
                  stamp: str) -> list[str]:
    """``--log_samples``: ``samples/<model>/samples_<task>_<stamp>.jsonl`` in the run folder, one line per
    scored item in scoring order, lm-eval's fields as its samples files hold them (``doc_id``, ``doc`` — an lm-eval
    task's dataset row —, ``target`` — ``str()`` of lm-eval's, an MC gold's index —, ``arguments`` as
    ``gen_args_i``, ``resps`` and ``filtered_resps`` as text — a log-likelihood item's ``(loglik, is_greedy)`` per
    choice, a generated answer after the run's filter —, ``filter``, ``metrics``, ``doc_hash``, ``prompt_hash``,
    ``target_hash``, then each metric of that filter by its name, the run's first); certeval adds ``item_id``,
    ``round`` and ``prob`` (selection probability). Beside them ``results_<stamp>.json``, the model's lm-eval
    results file (each certified interval as ``<metric>_ci_lower`` / ``_ci_upper``), so each folder is what
    ``lm_eval --output_path … --log_samples`` writes. The files read back as scores and history (lm-eval's layout:
    the folder names the model; the first metric is the run's). A generation task's other filters get a line per
    item each, after the run's filter's lines, as lm-eval writes a line per (doc, filter); a run over tasks of
    several output types writes a file per task, each line with its task's metrics."""
    task = results.task
    metric, filt = results_metric_key(results.to_json())
    entries = {m.model: m for m in results.models}
    docs: dict[str, dict] = {}
    position: dict[str, int] = {}
    if bank_frame is not None:
        position = {str(i): k for k, i in enumerate(bank_frame["item_id"].astype(str))}
        frame = bank_frame.drop(columns=[c for c in ("embedding", TASK_META) if c in bank_frame.columns])
        docs = {str(r["item_id"]): r for r in json.loads(frame.to_json(orient="records"))}
    written = []
    listed = {meta["task"]: [m["metric"] for m in meta["metrics"]] for meta in task_metas(bank_frame)}
    for model, group in rounds.groupby("model", sort=False) if len(rounds) else []:
        others = _other_item_scores(entries.get(str(model)), group, bank_frame, filt)
        per_task = _task_item_scores(entries.get(str(model)), group, bank_frame)  # a mixed run's, by task
        files: dict[str, list[str]] = {}
        by_filter: dict[tuple[str, str], list[str]] = {}  # a generation task's other filters: after the run's
        for row in group.sort_values("round", kind="stable").itertuples(index=False):
            item_id = str(row.item_id)
            bank_row = docs.get(item_id, {"item_id": item_id})
            file_task = str(bank_row.get("subset")) if per_task else task
            line_filt, scores = per_task.get(file_task, (filt, others))
            names = [metric, *scores]
            doc, target = _doc_and_target(bank_row)
            task_doc = _lm_eval_doc(bank_row)
            resps, kept = _responses(bank_row, getattr(row, "output", None), getattr(row, RESPS, None), line_filt)
            arguments = _arguments(bank_row)
            first = (arguments.get("gen_args_0") or {}).get("arg_0")
            line = {
                "doc_id": task_doc["doc_id"] if task_doc else position.get(item_id, item_id), "doc": doc,
                "target": target, "arguments": arguments, "resps": resps, "filtered_resps": kept, "filter": line_filt,
                "metrics": names,
                "doc_hash": _hash(json.dumps(doc, indent=2, default=str, ensure_ascii=False)),
                "prompt_hash": _hash(first) if isinstance(first, str) else None, "target_hash": _hash(str(target)),
                metric: float(row.score), **{name: values[item_id] for name, values in scores.items()},
                **_uncertified_values(bank_row, getattr(row, RESPS, None), listed.get(str(bank_row.get("subset")))),
                "item_id": item_id, "round": int(row.round),
                "prob": None if getattr(row, "prob", None) is None else float(row.prob)}
            files.setdefault(file_task, []).append(dumps(line, indent=None).decode())
            for other in _other_filter_lines(line, bank_row, getattr(row, "output", None)):
                by_filter.setdefault((file_task, other["filter"]), []).append(dumps(other, indent=None).decode())
        for (file_task, _), more in by_filter.items():
            files[file_task] += more
        for file_task, lines in files.items():  # one file per task, as lm-eval writes them
            rel = f"samples/{safe_name(str(model))}/samples_{file_task}_{stamp}.jsonl"
            folder.write_bytes(rel, ("\n".join(lines) + "\n").encode())
            written.append(folder.url(rel))
        block = results.lm_eval.get(str(model))
        if block is not None:
            folder.write_bytes(f"samples/{safe_name(str(model))}/results_{stamp}.json", dumps(block))
    return written


def _other_item_scores(entry: ModelResult | None, group: pd.DataFrame, bank_frame: pd.DataFrame | None,
                       filt: str) -> dict[str, dict[str, float]]:
    """Per-item values of the model's other reported metrics of the run's filter (results.json's ``metrics``)."""
    if not entry or bank_frame is None:
        return {}
    kind = "loglik" if RESPS in group.columns and group[RESPS].notna().all() else "generate"
    out = {}
    for key in entry.metrics or {}:
        name, _, other_filter = key.partition(",")
        if other_filter != filt:
            continue
        scores = item_scores((name, other_filter), group, bank_frame, kind)
        if isinstance(scores, dict):
            out[name] = scores
    return out


def _task_item_scores(entry: ModelResult | None, group: pd.DataFrame, bank_frame: pd.DataFrame | None
                      ) -> dict[str, tuple[str, dict[str, dict[str, float]]]]:
    """A mixed run's lines per task: ``{task: (its first filter, {metric: {item_id: value}})}`` for the certified
    metrics of that filter in results.json's ``task_metrics``; empty for any other run."""
    if not entry or not entry.task_metrics or bank_frame is None:
        return {}
    subsets = bank_frame.set_index(bank_frame["item_id"].astype(str))["subset"].astype(str)
    tasks = group["item_id"].astype(str).map(subsets)
    out = {}
    for task, metrics in entry.task_metrics.items():
        keys = [key.partition(",") for key in metrics]
        first = keys[0][2] if keys else FILTER
        mine = group[tasks == task]
        kind = "generate" if RESPS not in mine.columns or mine[RESPS].isna().all() else "loglik"
        scores = {}
        for name, _, filt in keys:
            if filt == first and metrics[f"{name},{filt}"].certified and len(mine):
                values = item_scores((name, filt), mine, bank_frame, kind)
                if isinstance(values, dict):
                    scores[name] = values
        out[task] = (first, scores)
    return out


def _other_filter_lines(line: dict[str, Any], bank_row: dict, output: Any) -> list[dict[str, Any]]:
    """A generation item's lines for its task's other filters, as lm-eval writes a line per (doc, filter): the
    answer after that filter and each of the task's metrics judged on it by lm-eval."""
    scoring = bank_row.get(SCORING)
    if not isinstance(scoring, str) or not scoring or _missing(output):
        return []
    judged = pairs(bank_row)
    out = []
    for filt in dict.fromkeys(f for _, f in judged):
        if filt == line["filter"]:
            continue
        names = [m for m, f in judged if f == filt]
        kept = {"doc_id", "doc", "target", "arguments", "resps", "doc_hash", "prompt_hash", "target_hash",
                "item_id", "round", "prob"}
        out.append({**{k: v for k, v in line.items() if k in kept},
                    "filtered_resps": [_sanitized(filtered(str(output), bank_row, filt))], "filter": filt,
                    "metrics": names, **{m: judge(str(output), bank_row, (m, filt)) for m in names}})
    return out


def _uncertified_values(bank_row: dict, resps: Any, listed: list[str] | None) -> dict[str, Any]:
    """A LAMBADA or perplexity doc's per-doc values of lm-eval's metrics certeval reports but does not certify
    (``perplexity``: the loglik; ``word_perplexity`` etc.: ``[loglik, words or bytes]``), as lm-eval's lines hold
    them, for the metrics its task lists."""
    if _missing(resps) or lm_eval_output_types.parsed(bank_row) is None:
        return {}
    values = {m: lm_eval_output_types.per_doc_value(m, json.loads(resps), bank_row)
              for m in listed or [] if m in lm_eval_output_types.UNCERTIFIED}
    return {m: v for m, v in values.items() if v is not None}
