"""An lm-eval task as a bank, built by lm-eval's own task machinery: ``--tasks path/to/task.yaml`` (one task or
one group), or ``--tasks NAME[,NAME…] [--include_path DIR]`` (tasks or groups lm-eval's index knows, as ``lm_eval``
takes them; stored as ``lm-eval:NAME[,…][?include_path=DIR]``). A group's leaf tasks are the bank's sub-datasets;
when the group tells lm-eval how to aggregate them (``aggregate_metric_list``: ``weight_by_size``), the run's
``--aggregate`` defaults to the same estimand (column ``lm_eval_aggregate``).

lm-eval loads the task (its dataset, ``doc_to_text`` / ``doc_to_choice`` / ``doc_to_target``, few-shot examples
with its default few-shot seed) and builds its requests exactly as ``lm_eval`` would; each doc becomes one item
read by the same rule as a ``--log_samples`` file (:func:`certeval.harnesses.readers.read_lm_eval_items`): a multiple-choice
doc keeps lm-eval's exact context as ``prompt``, its choices and the gold, so ``mc-loglik`` / ``mc-loglik-norm``
are lm-eval's ``acc`` / ``acc_norm`` on the same requests; item ids are ``<task>/<doc_id>``, as in lm-eval's
samples. A ``generate_until`` doc keeps its context, its request's generation settings and the task's filters,
metrics and gold as data (:mod:`certeval.scoring.lm_eval_generation`), so the ``lm-eval`` scorer generates and judges it as
lm-eval does. A ``loglikelihood`` (LAMBADA), ``loglikelihood_rolling`` (perplexity) or Winogrande-style doc (several
contexts, one continuation) keeps lm-eval's own requests (:mod:`certeval.harnesses.lm_eval_output_types`); tasks of several output
types make one bank whose items each name their task's judge. Every item also keeps what lm-eval's outputs say of
it: its task's version, ``num_fewshot``, ``output_type``, listed metrics and config (column ``lm_eval_task``), and
its dataset row and target (``lm_eval_doc``), so results and samples carry them as ``lm_eval`` writes them
(:mod:`certeval.harnesses.lm_eval_output`).

The YAML is the user's own task: loading it runs what it names (``!function`` hooks), as ``lm_eval`` itself does.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pandas as pd

from certeval.errors import InputError

TASK_SUFFIXES = (".yaml", ".yml")
NAMES_PREFIX = "lm-eval:"  # a bank named by lm-eval task names: lm-eval:NAME[,NAME...][?include_path=DIR]
AGGREGATE = "lm_eval_aggregate"  # bank column: the estimand of the group lm-eval would report (mean / subset-mean)
TASK_META = "lm_eval_task"  # bank column: the JSON of the item's task as lm-eval reports it (:func:`task_meta`)
DOC = "lm_eval_doc"  # bank column: the JSON of the item's doc_id, dataset row and lm-eval's target
FEWSHOT_SEED = 1234  # lm-eval's default (simple_evaluate's fewshot_random_seed): its few-shot examples, not others
_NAME = re.compile(r"^[A-Za-z0-9_\-]+(,[A-Za-z0-9_\-]+)*$")


def _split(location: str) -> tuple[str, dict[str, str]]:
    """A task bank's location and its query (``include_path``, ``num_fewshot``)."""
    text, _, query = str(location).partition("?")
    return text, dict(parse_qsl(query))


def bank_request_options(location: str | None):
    """The request flags a bank's location carries (:class:`certeval.harnesses.lm_eval_requests.RequestOptions`; lm-eval's
    defaults for a bank of no lm-eval task)."""
    from .lm_eval_requests import RequestOptions

    return RequestOptions.from_query(_split(str(location))[1]) if is_lm_eval_task(location) else RequestOptions()


def is_task_yaml(location: str | None) -> bool:
    return bool(location) and _split(str(location))[0].lower().endswith(TASK_SUFFIXES)


def is_lm_eval_task(location: str | None) -> bool:
    """A bank lm-eval builds (a task YAML, or task names): building it runs the tasks' own code."""
    return is_task_yaml(location) or (bool(location) and str(location).startswith(NAMES_PREFIX))


def check_include_path(include_path: str) -> Path:
    """``--include_path``: an existing folder holding at least one task YAML (looked for without following links,
    at most 100,000 entries)."""
    folder = Path(include_path).expanduser()
    if not folder.is_dir():
        raise InputError(f"--include_path {include_path!r} is not a folder of lm-eval task YAMLs")
    seen = 0
    for _, dirs, files in os.walk(folder):
        if any(f.lower().endswith(TASK_SUFFIXES) for f in files):
            return folder
        seen += len(dirs) + len(files)
        if seen > 100_000:
            break
    raise InputError(f"--include_path {include_path!r} holds no lm-eval task YAML (*.yaml)")


def tasks_bank(tasks: str, include_path: str | None, num_fewshot: int | None = None, requests=None) -> str:
    """The bank ``--tasks`` names: a YAML file as it is, lm-eval task names as ``lm-eval:NAMES[?include_path=…]``
    (``num_fewshot=N`` added to either for ``--num_fewshot``, and the request flags of ``requests``, a
    :class:`certeval.harnesses.lm_eval_requests.RequestOptions`); InputError for a value that is neither."""
    from .lm_eval_yaml import check_num_fewshot

    check_num_fewshot(num_fewshot, "--num_fewshot", str(num_fewshot))
    query = {} if num_fewshot is None else {"num_fewshot": str(num_fewshot)}
    flags = requests.query() if requests is not None else {}
    query.update(flags)
    if is_task_yaml(tasks):
        return tasks + (f"?{urlencode(query)}" if query else "")
    if include_path is None and (not _NAME.match(tasks) or Path(tasks).exists()):
        if query:  # a bank file given as --tasks (lm-eval's flag for what certeval calls --bank)
            flag = "--num_fewshot" if num_fewshot is not None else f"--{next(iter(flags))}"
            raise InputError(f"{flag} {query[flag[2:]]!r} applies to lm-eval tasks (a task YAML or task names); "
                             f"--tasks {tasks!r} is a bank file")
        return tasks
    if not _NAME.match(tasks):
        raise InputError(f"--include_path applies to lm-eval task names (--tasks NAME[,NAME...]); --tasks {tasks!r} "
                         "is not one")
    if include_path is None:
        return NAMES_PREFIX + tasks + (f"?{urlencode(query)}" if query else "")
    folder = check_include_path(include_path)
    return f"{NAMES_PREFIX}{tasks}?{urlencode({'include_path': str(folder.resolve()), **query})}"


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _manager(include_path: str | None, value: str, with_defaults: bool = False):
    """lm-eval's task index: of ``include_path`` alone when given one (indexing lm-eval's ~14,000 built-in tasks
    takes half a minute), with lm-eval's own tasks when there is no folder or ``with_defaults``."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise InputError(f"--tasks {value!r} names an lm-eval task; it needs the package lm-eval") from None
    try:
        with _quiet():
            return TaskManager(include_path=include_path, include_defaults=with_defaults or include_path is None)
    except Exception as exc:
        raise InputError(f"--tasks {value!r}: lm-eval could not read the tasks in "
                         f"{include_path or 'its own index'!r}: {_first_line(exc)}") from None


def _yaml_name(manager, path: Path, value: str) -> str:
    """The one task or group the YAML defines, as lm-eval's index of its folder records it."""
    resolved = path.resolve()
    names = [name for name, entry in manager.task_index.items()
             if Path(str(getattr(entry, "yaml_path", "") or "")).resolve() == resolved]
    kinds = {name: str(getattr(manager.task_index[name], "kind", "")).lower() for name in names}
    chosen = [name for name in names if "tag" not in kinds[name]]
    if len(chosen) != 1:
        found = ", ".join(f"{n} ({kinds[n] or 'task'})" for n in names) or "nothing lm-eval could index"
        raise InputError(f"--tasks {value!r}: lm-eval task {str(path)!r} must define exactly one task or group "
                         f"('task: NAME' or 'group: NAME'); it defines {found}")
    return chosen[0]


def _check_entries(manager, names: list[str], value: str, where: str) -> None:
    """The static checks (certeval.harnesses.lm_eval_yaml) of every named task or group's YAML, and a group's members known
    to the index: lm-eval would otherwise fail deep inside its loader, or import a missing hook."""
    from .lm_eval_yaml import check_task_yaml

    todo, seen = list(names), set()
    while todo and len(seen) < 10_000:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        yaml_path = getattr(manager.task_index.get(name), "yaml_path", None)
        if not yaml_path or not str(yaml_path).lower().endswith(TASK_SUFFIXES):
            continue
        config = check_task_yaml(Path(str(yaml_path)), "--tasks", value)
        if "group" in config:
            for member in config.get("task") or []:
                if isinstance(member, str):
                    if member not in manager.task_index:
                        raise InputError(f"--tasks {value!r}: group {config['group']!r} names task {member!r}, which "
                                         f"lm-eval does not know {where}")
                    todo.append(member)


def _resolve(location: str) -> tuple[Any, list[str], str, str, int | None]:
    """lm-eval's task manager, the names to load, how to name the source in messages, the value given to --tasks
    and the --num_fewshot override."""
    from .lm_eval_yaml import check_num_fewshot, check_task_yaml

    text, params = _split(location)
    shots = params.get("num_fewshot")
    if shots is not None:
        try:
            shots = int(shots)
        except ValueError:
            pass
        check_num_fewshot(shots, "--num_fewshot", str(shots))
    if is_task_yaml(text):
        path = Path(text).expanduser()
        if not path.is_file():
            raise InputError(f"--tasks {text!r}: lm-eval task {text!r} does not exist (give the task's YAML file)")
        check_task_yaml(path, "--tasks", text)  # read as data first: nothing of it is imported before this
        manager = _manager(str(path.parent), text)
        name = _yaml_name(manager, path, text)
        _check_entries(manager, [name], text, f"in {str(path.parent)!r}")
        return manager, [name], f"lm-eval task {text}", text, shots
    names_text = text[len(NAMES_PREFIX):]
    include_path = params.get("include_path")
    names = names_text.split(",")
    manager = _manager(include_path, names_text)
    missing = [n for n in names if n not in manager.task_index]
    if missing and include_path:  # as lm_eval --include_path: the folder's tasks beside lm-eval's own
        manager = _manager(include_path, names_text, with_defaults=True)
        missing = [n for n in names if n not in manager.task_index]
    where = f"in {include_path!r}" if include_path else "in lm-eval's own tasks (add --include_path DIR for yours)"
    if missing:
        raise InputError(f"--tasks {names_text!r} is no file, and lm-eval knows no task or group {missing[0]!r} "
                         f"{where}")
    _check_entries(manager, names, names_text, where)
    return manager, names, f"lm-eval tasks {names_text}", names_text, shots


def _group_aggregate(groups: dict) -> str | None:
    """The estimand lm-eval reports for the one group loaded: size-weighted (the plain mean) or each leaf once."""
    weights = {bool(getattr(agg, "weight_by_size", True)) for group in groups.values()
               for agg in (getattr(group, "aggregate_metric_list", None) or [])}
    if len(groups) != 1 or len(weights) != 1:
        return None
    return "mean" if weights.pop() else "subset-mean"


def task_meta(task, name: str) -> dict[str, Any]:
    """What lm-eval's results file says of a task: its version (``versions``), ``num_fewshot`` (``n-shot``),
    ``output_type``, the metrics it lists with their direction and aggregation, its filters and its config as
    lm-eval dumps it (``configs``)."""
    from lm_eval.utils import handle_non_serializable

    config = task.config
    filters = [str(entry["name"]) for entry in (config.filter_list or [])] or ["none"]
    higher = task.higher_is_better() or {}
    aggregation = task.aggregation() or {}
    metrics = [{"metric": str(m), "higher_is_better": higher.get(m),
                "aggregation": getattr(aggregation.get(m), "__name__", str(aggregation.get(m)))}
               for m in task._metric_fn_list]
    dumped = json.loads(json.dumps(task.dump_config(), default=handle_non_serializable))
    return {"task": name, "version": task.VERSION, "num_fewshot": int(config.num_fewshot or 0),
            "output_type": str(task.OUTPUT_TYPE), "metrics": metrics, "filters": filters, "config": dumped}


def _records(task, name: str) -> list[dict]:
    """lm-eval's requests grouped per doc, as its samples files record them (doc_id, doc, target, arguments); a
    multiple-choice doc also with its choices as the task gives them (``doc_to_choice``: what acc_norm measures)
    and whether the task reads several golds (its ``multiple_target``), for lm-eval's gold rule."""
    by_doc: dict[int, dict] = {}
    choices = str(task.OUTPUT_TYPE) == "multiple_choice" and not getattr(task, "multiple_input", 0)
    for instance in sorted(task.instances, key=lambda i: (i.doc_id, i.idx)):
        rec = by_doc.get(instance.doc_id)
        if rec is None:
            rec = by_doc[instance.doc_id] = {"doc_id": instance.doc_id, "doc": instance.doc,
                                             "target": task.doc_to_target(instance.doc), "arguments": []}
            if choices:
                rec["task_choices"] = list(task.doc_to_choice(instance.doc))
                rec["several"] = bool(getattr(task, "multiple_target", 0))
        rec["arguments"].append(list(instance.arguments))
    if not by_doc:
        raise InputError(f"lm-eval task {name!r} built no request (an empty split?)")
    return [by_doc[k] for k in sorted(by_doc)]


def _doc_text(where: str, rec: dict) -> str:
    """The dataset row and lm-eval's target of one doc, as its samples file records them."""
    try:
        return json.dumps({"doc_id": rec["doc_id"], "doc": rec["doc"], "target": rec["target"]})  # the row's key order
    except (TypeError, ValueError):
        raise InputError(f"{where}: doc {rec['doc_id']!r} is not plain data (JSON); certeval could not keep it to "
                         "write lm-eval's samples") from None


@contextlib.contextmanager
def _quiet():
    """lm-eval's and datasets' progress bars and notes off while the bank is built: a command's stderr stays the
    one line of its outcome (their failures still surface, as the InputError below)."""
    loggers = [logging.getLogger(name) for name in ("lm_eval", "lm-eval", "datasets")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _fewshot(task, name: str, shots: int | None, value: str) -> None:
    """``--num_fewshot`` over the task's own count, and the count against the examples its few-shot split holds."""
    if shots is not None:
        task.set_config("num_fewshot", shots)
    count = getattr(task.config, "num_fewshot", None)
    if not count:
        return
    docs = task.fewshot_docs()
    if docs is not None and count > len(docs):
        raise InputError(f"--tasks {value!r}: num_fewshot {count} asks task {name!r} for more few-shot examples than "
                         f"its few-shot split holds ({len(docs)})")


def load_task_items(location: str) -> pd.DataFrame:
    """The items of an lm-eval task or group (see the module docstring): ``<task>/<doc_id>``, sub-dataset the task."""
    from .lm_eval_requests import RequestOptions

    manager, names, where, value, shots = _resolve(location)
    try:
        return _load_items(manager, names, where, value, shots, RequestOptions.from_query(_split(location)[1]))
    except InputError as exc:  # every refusal names the flag and the value it was given
        text = str(exc)
        if text.startswith(("--tasks", "--num_fewshot")):
            raise
        raise InputError(f"--tasks {value!r}: {text}") from None


def _load_items(manager, names: list[str], where: str, value: str, shots: int | None, requests) -> pd.DataFrame:
    from certeval.scoring.lm_eval_generation import item_fields, task_scoring

    from .lm_eval_output_types import mark_judges, request_item
    from .readers import GENERATE_UNTIL, _lm_eval_item

    build = requests.build_kwargs()  # a chat template's tokenizer, read once
    try:
        with _quiet():
            loaded = manager.load(names)
            tasks = loaded["tasks"]
            for name, task in tasks.items():
                _fewshot(task, name, shots, value)
                task.set_fewshot_seed(seed=FEWSHOT_SEED)
                requests.configure(task)
                task.build_all_requests(limit=None, rank=0, world_size=1, **build)
    except InputError:
        raise
    except Exception as exc:
        shots_text = "" if shots is None else f", --num_fewshot {shots}"
        raise InputError(f"lm-eval could not build {', '.join(names)!r} ({where}{shots_text}): "
                         f"{_first_line(exc)}") from None
    if not tasks:
        raise InputError(f"{', '.join(names)!r} holds no task ({where})")
    items = []
    for name, task in tasks.items():
        records = _records(task, name)
        mine = [request_item(task, name, rec) or _lm_eval_item(where, name, rec) for rec in records]
        meta = json.dumps(task_meta(task, name), sort_keys=True)  # one text object for all the task's items
        for item, rec in zip(mine, records):
            item[TASK_META] = meta
            item[DOC] = _doc_text(where, rec)
        if any(GENERATE_UNTIL in item for item in mine):
            scoring = task_scoring(task, name)
            for item, rec in zip(mine, records):
                item.update(item_fields(task, name, scoring, rec["doc"], rec["arguments"][0][1]))
        items += mine
    mark_judges(items, {name: task_meta(task, name) for name, task in tasks.items()})
    frame = pd.DataFrame(items)
    aggregate = _group_aggregate(loaded.get("groups") or {})
    if aggregate is not None:
        frame[AGGREGATE] = aggregate
    return frame
