"""lm-eval requests other than one context with several continuations: a ``loglikelihood`` task (LAMBADA-style:
one context, one continuation), a ``loglikelihood_rolling`` task (perplexity: one text scored whole) and a
``multiple_choice`` task with ``multiple_input`` (Winogrande-style: several contexts, one continuation).

Such a doc keeps lm-eval's own requests as data (column :data:`REQUESTS`: its output type and the ``arguments`` of
its ``Instance``\\ s, in order), so a host scores exactly those pairs or texts, and the judges and metrics read
lm-eval's per-doc values off the answers (``(loglik, is_greedy)`` per request, as lm-eval's ``resps``):

* ``loglikelihood``: ``acc`` = ``is_greedy`` (a per-item score in [0, 1], certified); ``perplexity`` =
  ``exp(-mean loglik)`` over the scored docs, lm-eval's aggregate — a log-likelihood is unbounded below, so its
  mean has no bounded-mean interval: reported as a value, never certified.
* ``loglikelihood_rolling``: ``word_perplexity`` = ``exp(-Σ loglik / Σ words)``, ``byte_perplexity`` =
  ``exp(-Σ loglik / Σ bytes)``, ``bits_per_byte`` = ``-Σ loglik / (Σ bytes · ln 2)`` over the scored docs,
  lm-eval's ``weighted_perplexity`` / ``bits_per_byte`` aggregates. They are ratios of two corpus sums, not means of
  per-item scores in [0, 1]: reported as values (the corpus's own when every doc is scored), never certified. What
  a run certifies is certeval's own per-doc quantity ``byte_likelihood`` = ``exp(loglik / bytes)`` in (0, 1] (the
  doc's geometric-mean probability per byte), its bank mean, named as certeval's, not lm-eval's.
* ``multiple_input``: the choices are lm-eval's ``doc_to_choice`` (their lengths give ``acc_norm``), the gold is
  ``doc_to_text``'s index, as ``process_results`` reads them; ``mc-loglik`` / ``mc-loglik-norm`` judge it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from certeval.errors import InputError

REQUESTS = "lm_eval_requests"  # bank column: JSON {"output_type", "requests": [[context, continuation] | [text]]}
LOGLIKELIHOOD = "loglikelihood"
ROLLING = "loglikelihood_rolling"
MULTIPLE_CHOICE = "multiple_choice"
ROLLING_METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")
UNCERTIFIED = {  # lm-eval's metric -> why certeval reports its value over the scored docs but no interval
    "perplexity": "exp(-mean loglik): a log-likelihood is unbounded below, so its mean has no bounded-mean interval",
    **{m: "a ratio of two corpus sums (lm-eval's weighted aggregate), not a mean of per-item scores in [0, 1]"
       for m in ROLLING_METRICS},
}


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def parsed(item: dict[str, Any]) -> dict[str, Any] | None:
    """An item's lm-eval requests (:data:`REQUESTS`), or None for an item that has none."""
    text = item.get(REQUESTS)
    return None if _missing(text) or not text else json.loads(text)


def output_type(item: dict[str, Any]) -> str | None:
    requests = parsed(item)
    return None if requests is None else str(requests["output_type"])


def string_pairs(item: dict[str, Any]) -> list[tuple[str, str]] | None:
    """The (context, continuation) pairs of a loglikelihood or multiple_input item; None for other items."""
    requests = parsed(item)
    if requests is None or requests["output_type"] == ROLLING:
        return None
    return [(str(c), str(t)) for c, t in requests["requests"]]


def rolling_text(item: dict[str, Any]) -> str | None:
    """The text a loglikelihood_rolling item scores whole; None for other items."""
    requests = parsed(item)
    if requests is None or requests["output_type"] != ROLLING:
        return None
    return str(requests["requests"][0][0])


# ---------------------------------------------------------------------------------------- building an item

def count_words(text: str) -> int:
    """lm-eval's ``Task.count_words``: the pieces between runs of whitespace."""
    return len(re.split(r"\s+", text))


def count_bytes(text: str) -> int:
    return len(text.encode("utf-8"))


def request_item(task, name: str, rec: dict) -> dict[str, Any] | None:
    """The item of one doc of ``task`` whose requests are not one context with several continuations (module
    docstring); None for a doc the plain multiple-choice or generation readers take. ``rec``: doc_id, doc,
    arguments (each request's), as :func:`certeval.harnesses.lm_eval_tasks._records` groups them."""
    kind = str(task.OUTPUT_TYPE)
    doc, args = rec["doc"], [list(a) for a in rec["arguments"]]
    where = f"lm-eval task {name!r} doc {rec['doc_id']!r}"
    row = {"item_id": f"{name}/{rec['doc_id']}", "subset": name}
    if kind == LOGLIKELIHOOD:
        context, continuation = args[0]
        return {**row, "question": context, "prompt": context, "answer": continuation,
                REQUESTS: json.dumps({"output_type": kind, "requests": [[context, continuation]]})}
    if kind == ROLLING:
        text = args[0][0]
        return {**row, "question": text, "prompt": text, "answer": text,
                REQUESTS: json.dumps({"output_type": kind, "requests": [[text]], "words": count_words(text),
                                      "bytes": count_bytes(text)})}
    if kind == MULTIPLE_CHOICE and getattr(task, "multiple_input", False):
        choices = [str(c) for c in task.doc_to_choice(doc)]
        gold = task.doc_to_text(doc)  # process_results' gold for several contexts: doc_to_text's index
        if isinstance(gold, str) and gold in choices:
            gold = choices.index(gold)
        if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
            raise InputError(f"{where}: its gold {gold!r} is not one index among its {len(choices)} contexts")
        if len(args) != len(choices):
            raise InputError(f"{where}: {len(args)} contexts for {len(choices)} choices")
        return {**row, "question": args[gold][0], "prompt": args[gold][0], "choices": choices, "answer": gold,
                REQUESTS: json.dumps({"output_type": kind, "requests": args})}
    return None


# ---------------------------------------------------------------------------------------- per-doc values

def per_doc_value(metric: str, resps: list[list[Any]], item: dict[str, Any]) -> float | list[float] | None:
    """lm-eval's ``process_results`` value of ``metric`` for one loglikelihood / rolling doc from its ``(loglik,
    is_greedy)`` answers: ``acc`` (is_greedy) and ``perplexity`` (the loglik) of a loglikelihood doc, ``[loglik,
    words]`` / ``[loglik, bytes]`` of a rolling doc; certeval's ``byte_likelihood`` of a rolling doc. None when the
    doc does not give it."""
    requests = parsed(item)
    if requests is None or not resps:
        return None
    loglik = float(resps[0][0])
    if requests["output_type"] == LOGLIKELIHOOD:
        if metric == "acc":
            return None if resps[0][1] is None else float(bool(resps[0][1]))
        return loglik if metric == "perplexity" else None
    if requests["output_type"] == ROLLING:
        if metric == "word_perplexity":
            return [loglik, float(requests["words"])]
        if metric in ("byte_perplexity", "bits_per_byte"):
            return [loglik, float(requests["bytes"])]
        if metric == "byte_likelihood":
            return math.exp(loglik / max(1, int(requests["bytes"])))
    return None


def aggregate(metric: str, values: list[Any]) -> float:
    """lm-eval's aggregate of ``metric`` over per-doc values (:func:`per_doc_value`)."""
    if metric == "perplexity":
        return math.exp(-sum(values) / len(values))
    total = sum(v[0] for v in values) / sum(v[1] for v in values)
    return -total / math.log(2) if metric == "bits_per_byte" else math.exp(-total)


# ---------------------------------------------------------------------------------------- tasks of mixed types

MIXED_SCORER = "lm-eval-task"  # each item judged by its own task's first metric: a run over mixed output types
FIRST_METRIC_SCORERS = {"acc": "mc-loglik", "acc_norm": "mc-loglik-norm"}  # multiple choice: metric -> judge
TYPE_SCORERS = {LOGLIKELIHOOD: "greedy", ROLLING: "byte-likelihood", "generate_until": "lm-eval"}


def meta_scorer(meta: dict[str, Any]) -> str | None:
    """The judge of a task's first metric (:func:`certeval.scoring.lm_eval_metrics.task_metas`' entry): acc (is_greedy) of
    a loglikelihood task, certeval's byte likelihood of a rolling one, the task's first metric and filter of a
    generation task (``lm-eval``), acc / acc_norm of multiple choice; None for another first metric (certeval's
    default judge then: acc)."""
    if meta["output_type"] in TYPE_SCORERS:
        return TYPE_SCORERS[meta["output_type"]]
    first = [m["metric"] for m in meta["metrics"]][:1]
    return FIRST_METRIC_SCORERS.get(first[0]) if first else None


JUDGE = "lm_eval_judge"  # bank column of tasks of several output types: the judge of the item's task's first metric


def mark_judges(items: list[dict[str, Any]], metas: dict[str, dict[str, Any]]) -> None:
    """Each item of tasks of several output types names its own task's judge (:func:`meta_scorer`, the first
    metric and filter for generation), so a host asks and judges it as its task does; ``metas`` by task name."""
    from certeval.scoring.lm_eval_generation import SCORING, qualified

    if len({meta["output_type"] for meta in metas.values()}) < 2:
        return
    for item in items:
        name = meta_scorer(metas[item["subset"]]) or "mc-loglik"
        item[JUDGE] = qualified(name, str(item[SCORING])) if name == "lm-eval" else name


def item_scorer_name(item: dict[str, Any]) -> str:
    """The judge of one item of a mixed run: its own task's (:func:`mark_judges`)."""
    name = item.get(JUDGE)
    if _missing(name) or not name:
        raise InputError(f"item {item.get('item_id')!r}: scorer {MIXED_SCORER!r} judges items of lm-eval tasks "
                         "of several output types (--tasks) by their own task's first metric; this one has none")
    return str(name)


def check_mixed_scorer(metas: list[dict[str, Any]], scorer: str | None, bank: Any) -> None:
    """A bank whose tasks (``metas``: :func:`certeval.scoring.lm_eval_metrics.task_metas`) need different judges runs only
    with :data:`MIXED_SCORER`; that scorer only on such a bank's items (InputError naming the scorer and the tasks'
    output types)."""
    kinds = sorted({meta["output_type"] for meta in metas})
    if len(kinds) > 1 and scorer not in (None, "", "auto", MIXED_SCORER):
        raise InputError(f"--scorer {scorer!r}: bank {bank!r} holds tasks of several output types "
                         f"({', '.join(kinds)}); each is judged by its own task's first metric (--scorer "
                         f"{MIXED_SCORER}, the default), every listed metric reported per task")
    if scorer == MIXED_SCORER and not metas:
        raise InputError(f"--scorer {MIXED_SCORER!r} judges items of lm-eval tasks (--tasks); bank {bank!r} holds "
                         "none")


def check_hosts(frame: Any, scorer: str | None, specs: Any) -> None:
    """An lm-eval task's own requests (LAMBADA, perplexity, Winogrande-style) and runs over several output types are
    asked by the ``hf`` host (and answered by ``replay``); another backend is refused before anything starts."""
    own = frame is not None and REQUESTS in frame.columns and frame[REQUESTS].notna().any()
    if not own and scorer != MIXED_SCORER:
        return
    for spec in specs:
        if spec.kind not in ("hf", "replay"):
            raise InputError(f"--model {spec.text!r}: the bank's lm-eval tasks ask loglikelihood, rolling or "
                             "several-context requests (or are of several output types), which certeval asks as "
                             "lm-eval does only with --model hf")
