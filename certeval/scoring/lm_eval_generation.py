"""A ``generate_until`` item of an lm-eval task, generated and scored as lm-eval does.

lm-eval's evaluator answers a ``generate_until`` request greedily until one of the request's ``until`` strings
(or ``max_gen_toks`` tokens), cuts the text at the first ``until`` string (its ``postprocess_generated_text``),
runs each of the task's filter pipelines (``filter_list``; ``take_first`` when it names none) over the answer
and scores the filtered answer with each metric of ``metric_list`` against the doc's gold
(``ConfigurableTask.process_results``). certeval keeps all of that with the item, as data, when it builds an lm-eval
task YAML into a bank (:func:`item_fields`): the request's generation settings, the filter pipelines as lm-eval's
registry names and arguments, the metrics likewise, the doc and the gold as ``process_results`` computes it. A host
generates by :func:`generation_request` and :func:`cut_at_stop`; the ``lm-eval`` scorer (:func:`judge`) then runs
lm-eval's own registered filters (``build_filter_ensemble`` on a real ``Instance``) and metric functions.

Only names in lm-eval's registries are ever run from an item; a task whose filter, metric or ``process_results``
is the user's own code (``!function``), whose metric is not a score in [0, 1], or which samples, is refused when the
bank is built: certeval never scores such an item another way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from certeval.errors import InputError

SCORING = "lm_eval_scoring"  # bank column: the JSON of one item's lm-eval scoring (filters, metrics, doc, gold)
GENERATION = "lm_eval_generation"  # bank column: the JSON of the request's generation settings (until, max_gen_toks)
SCORER = "lm-eval"  # the scorer's name; "lm-eval:METRIC,FILTER" picks one of a task's metric/filter pairs
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's models' default when a request names no maximum
BOUNDED_METRICS = ("exact_match",)  # lm-eval generate_until metrics whose per-item value lies in [0, 1]
# what each metric may be given (lm-eval's exact_match passes these to HF's exact match): data, never callables
METRIC_KWARGS = {"exact_match": ("regexes_to_ignore", "ignore_case", "ignore_punctuation", "ignore_numbers")}
CODE_FILTERS = ("custom",)  # a registered filter that calls a function it is given: never run from data


@dataclass(frozen=True)
class GenerationRequest:
    """One greedy generation: the prompt, the strings it stops at and its token budget."""

    prompt: str
    until: tuple[str, ...]
    max_tokens: int
    cut: bool  # cut the text at the first ``until`` string, as lm-eval does (a bank's own items keep the old rule)


def generation_request(item: dict[str, Any], prompt: str, default_max_tokens: int) -> GenerationRequest:
    """The request for an item: an lm-eval item's own settings, else certeval's (stop at a newline)."""
    settings = item.get(GENERATION)
    if isinstance(settings, str) and settings:
        parsed = json.loads(settings)
        return GenerationRequest(prompt, tuple(parsed["until"]), int(parsed["max_gen_toks"]), True)
    return GenerationRequest(prompt, ("\n",), int(default_max_tokens), False)


def cut_at_stop(text: str, request: GenerationRequest) -> str:
    """lm-eval's cut: the text before the first occurrence of each non-empty stop string, in turn."""
    if not request.cut:
        return text
    for stop in request.until:
        if stop:
            text = text.split(stop)[0]
    return text


# ---------------------------------------------------------------------------------------- building an item

def _generation_settings(gen_kwargs: Any, where: str) -> dict[str, Any]:
    """lm-eval's normalisation of a request's generation kwargs (until, max_gen_toks and its aliases, greedy)."""
    kwargs = dict(gen_kwargs or {})
    if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0.0) > 0.0:
        raise InputError(f"{where}: the task samples its answers (do_sample / temperature > 0); certeval generates "
                         "greedily and would not score it as lm-eval did")
    until = kwargs.get("until")
    until = [until] if isinstance(until, str) else list(until or [])
    budget = next((kwargs[k] for k in ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
                   if kwargs.get(k) is not None), DEFAULT_MAX_GEN_TOKS)
    return {"until": [str(u) for u in until], "max_gen_toks": int(budget)}


def task_scoring(task, name: str) -> dict[str, Any]:
    """The task's filter pipelines and metrics as registry names and arguments; InputError for code."""
    config = task.config
    if getattr(config, "process_results", None) is not None:
        raise InputError(f"lm-eval task {name!r} scores with its own process_results function; certeval runs only "
                         "lm-eval's registered filters and metrics")
    filters = []
    for entry in config.filter_list or [{"name": "none", "filter": [{"function": "take_first"}]}]:
        components = []
        for step in entry["filter"]:
            if not isinstance(step.get("function"), str):
                raise InputError(f"lm-eval task {name!r}: filter {entry['name']!r} runs the task's own code "
                                 f"({step.get('function')!r}); certeval runs only lm-eval's registered filters")
            components.append([step["function"], {k: v for k, v in step.items() if k != "function"}])
        filters.append({"name": str(entry["name"]), "components": components})
    entries = list(config.metric_list or [])
    if any(not isinstance(entry.get("metric"), str) for entry in entries):
        raise InputError(f"lm-eval task {name!r} scores with its own metric function; certeval runs only lm-eval's "
                         "registered metrics")
    metrics = []
    for metric, kwargs in task._metric_fn_kwargs.items():
        if metric not in BOUNDED_METRICS:
            raise InputError(f"lm-eval task {name!r}: metric {metric!r} is not one certeval certifies for generated "
                             f"answers (a per-item score in [0, 1] from lm-eval's registry: "
                             f"{', '.join(BOUNDED_METRICS)})")
        if any(entry.get("hf_evaluate") for entry in entries if entry.get("metric") == metric):
            raise InputError(f"lm-eval task {name!r}: metric {metric!r} is HF evaluate's (a download); certeval "
                             "runs lm-eval's own")
        metrics.append({"name": str(metric), "kwargs": dict(kwargs)})
    out = {"filters": filters, "metrics": metrics, "multiple_target": bool(task.multiple_target)}
    check_scoring(out, f"lm-eval task {name!r}")  # what a bank keeps is what any later judge accepts
    return out


def item_fields(task, name: str, scoring: dict[str, Any], doc: dict, gen_kwargs: Any) -> dict[str, str]:
    """One doc's columns: its generation settings and its scoring (the gold as ``process_results`` computes it)."""
    where = f"lm-eval task {name!r}"
    gold, cast = task.doc_to_target(doc), False
    if task.config.doc_to_choice is not None:
        gold = task.doc_to_choice(doc)[gold]
    elif scoring["multiple_target"]:
        gold = list(gold) if isinstance(gold, (list, tuple)) else gold
    else:  # process_results casts only this gold to the answer's type
        cast = True
    try:
        text = json.dumps({**scoring, "task": name, "doc": doc, "gold": gold, "cast_gold": cast}, sort_keys=True)
    except (TypeError, ValueError):
        raise InputError(f"{where}: a doc or gold is not plain data (JSON); certeval could not keep it to score "
                         "the item as lm-eval does") from None
    return {GENERATION: json.dumps(_generation_settings(gen_kwargs, where)), SCORING: text}


# ---------------------------------------------------------------------------------------- scoring an item

def is_lm_eval_scorer(name: str | None) -> bool:
    return isinstance(name, str) and (name == SCORER or name.startswith(SCORER + ":"))


def parse_choice(scorer_name: str) -> tuple[str, str] | None:
    """``lm-eval`` → None (the task's first metric and filter); ``lm-eval:METRIC,FILTER`` → (metric, filter)."""
    if scorer_name == SCORER:
        return None
    metric, sep, filt = scorer_name[len(SCORER) + 1:].partition(",")
    if not scorer_name.startswith(SCORER + ":") or not sep or not metric or not filt:
        raise InputError(f"scorer {scorer_name!r}: an lm-eval metric is named lm-eval:METRIC,FILTER "
                         "(e.g. lm-eval:exact_match,strict-match), as in lm-eval's results")
    return metric, filt


def qualified(scorer_name: str, scoring_text: str) -> str:
    """``lm-eval:METRIC,FILTER`` for the pair the scorer judges on these items; InputError for a pair they lack."""
    metric, filt = _pick(json.loads(scoring_text), parse_choice(scorer_name))
    return f"{SCORER}:{metric['name']},{filt['name']}"


def _pick(scoring: dict[str, Any], choice: tuple[str, str] | None) -> tuple[dict, dict]:
    metrics, filters = scoring["metrics"], scoring["filters"]
    if choice is None:
        return metrics[0], filters[0]
    metric = next((m for m in metrics if m["name"] == choice[0]), None)
    filt = next((f for f in filters if f["name"] == choice[1]), None)
    if metric is None or filt is None:
        have = ", ".join(f"{m['name']},{f['name']}" for m in metrics for f in filters)
        raise InputError(f"scorer 'lm-eval:{choice[0]},{choice[1]}': the task {scoring.get('task')!r} reports {have}")
    return metric, filt


def _plain(value: Any) -> bool:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return True
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def check_scoring(text: Any, where: str) -> dict[str, Any]:
    """One item's lm-eval scoring read as data: every metric and filter a name in lm-eval's own registries (the
    metrics certeval certifies, the filters that take no function), their arguments plain values. A name read from
    a bank or a run folder is never looked up any other way: lm-eval's ``get_metric`` loads an unknown name with HF
    evaluate, which imports a path as a module (issue 48)."""
    try:
        scoring = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        raise InputError(f"{where}: its {SCORING} is not JSON") from None
    if not isinstance(scoring, dict) or not isinstance(scoring.get("metrics"), list) or \
            not isinstance(scoring.get("filters"), list) or not scoring["metrics"] or not scoring["filters"]:
        raise InputError(f"{where}: its {SCORING} is not lm-eval scoring (metrics and filters)")
    from lm_eval import filters as _filters  # noqa: F401 - fills lm-eval's filter registry
    from lm_eval.api import metrics as _metrics  # noqa: F401 - fills lm-eval's metric registry
    from lm_eval.api.registry import filter_registry, metric_registry

    for metric in scoring["metrics"]:
        name = metric.get("name") if isinstance(metric, dict) else metric
        if not isinstance(name, str) or name not in BOUNDED_METRICS or name not in metric_registry:
            raise InputError(f"{where}: metric {name!r} is not one of lm-eval's registered metrics certeval runs "
                             f"({', '.join(BOUNDED_METRICS)}); a name read from data is never loaded as a file or "
                             "module")
        kwargs = metric.get("kwargs") or {}
        extra = sorted(set(kwargs) - set(METRIC_KWARGS.get(name, ()))) if isinstance(kwargs, dict) else [kwargs]
        if extra or not _plain(kwargs):
            raise InputError(f"{where}: metric {name!r} is given {extra[0] if extra else kwargs!r}, not an argument "
                             f"it takes ({', '.join(METRIC_KWARGS.get(name, ()))})")
    for entry in scoring["filters"]:
        steps = entry.get("components") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps:
            raise InputError(f"{where}: filter {entry!r} has no steps")
        for step in steps:
            fn = step[0] if isinstance(step, (list, tuple)) and len(step) == 2 else None
            if not isinstance(fn, str) or fn not in filter_registry or fn in CODE_FILTERS:
                raise InputError(f"{where}: filter step {fn if fn is not None else step!r} is not one of lm-eval's "
                                 "registered filters that take no function; a name read from data is never loaded "
                                 "as a file or module")
            if not _plain(step[1]):
                raise InputError(f"{where}: filter step {fn!r} is given {step[1]!r}, not plain values")
    return scoring


def check_scoring_column(frame: Any, where: str) -> None:
    """Every distinct lm-eval scoring of a bank's items (:func:`check_scoring`), before any item is judged."""
    if frame is None or SCORING not in frame.columns:
        return
    for item_id, text in frame[["item_id", SCORING]].drop_duplicates(SCORING).itertuples(index=False):
        if isinstance(text, str) and text:
            check_scoring(text, f"{where}, item {str(item_id)!r}")


def pairs(item: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (metric, filter) pair an lm-eval generation item is judged by, in lm-eval's order."""
    scoring = check_scoring(item[SCORING], f"item {str(item.get('item_id'))!r}")
    return [(m["name"], f["name"]) for f in scoring["filters"] for m in scoring["metrics"]]


def filtered(output: str, item: dict[str, Any], filter_name: str) -> Any:
    """One answer after the task's filter pipeline ``filter_name``, run by lm-eval (its ``filtered_resps``)."""
    scoring = check_scoring(item[SCORING], f"item {str(item.get('item_id'))!r}")
    return _filtered(output, item, scoring, next(f for f in scoring["filters"] if f["name"] == filter_name))


def _filtered(output: str, item: dict[str, Any], scoring: dict[str, Any], filt: dict[str, Any]) -> Any:
    from lm_eval.api.instance import Instance
    from lm_eval.filters import build_filter_ensemble

    ensemble = build_filter_ensemble(filt["name"], [(fn, kwargs or None) for fn, kwargs in filt["components"]])
    instance = Instance("generate_until", scoring["doc"], (str(item.get("prompt", "")), {}), 0,
                        (scoring.get("task"), None, 1))
    instance.resps = [output]
    ensemble.apply([instance])
    return instance.filtered_resps[filt["name"]]


def judge(output: str, item: dict[str, Any], choice: tuple[str, str] | None = None) -> float:
    """lm-eval's score of one answer: its filter pipeline, then ``process_results``' rule for one metric."""
    from lm_eval.api.registry import metric_registry

    scoring = check_scoring(item[SCORING], f"item {str(item.get('item_id'))!r}")
    metric, filt = _pick(scoring, choice)
    result = _filtered(output, item, scoring, filt)
    fn, kwargs, gold = metric_registry.get(metric["name"]), metric["kwargs"], scoring["gold"]
    if scoring["multiple_target"]:
        golds = gold if isinstance(gold, list) else [gold]
        if metric["name"] == "exact_match":  # process_results: any gold matched
            value = fn(references=golds, predictions=[result] * len(golds), **kwargs)["exact_match"]
            return 1.0 if value > 0.0 else 0.0
        return 1.0 if any(_value(fn(references=[g], predictions=[result], **kwargs), metric["name"])
                          for g in golds) else 0.0
    if scoring.get("cast_gold") and type(gold) is not type(result) and not isinstance(result, list):
        gold = type(result)(gold)
    return _value(fn(references=[gold], predictions=[result], **kwargs), metric["name"])


def _value(value: Any, name: str) -> float:
    return float(value[name] if isinstance(value, dict) else value)


def scorer_parts(name: str) -> tuple[Any, tuple[tuple[str, ...], ...]]:
    """The judge and required fields of the scorer named ``name`` (``lm-eval`` or ``lm-eval:M,F``)."""
    choice = parse_choice(name)

    def lm_eval_judge(output: str, item: dict[str, Any]) -> float:
        return judge(output, item, choice)

    return lm_eval_judge, (("prompt",), (SCORING,), (GENERATION,))


