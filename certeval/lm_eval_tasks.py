"""An lm-eval task YAML as a bank, built by lm-eval's own task machinery: ``--tasks path/to/task.yaml``.

lm-eval loads the task (its dataset, ``doc_to_text`` / ``doc_to_choice`` / ``doc_to_target``, few-shot examples
with its default few-shot seed) and builds its requests exactly as ``lm_eval`` would; each doc becomes one item
read by the same rule as a ``--log_samples`` file (:func:`certeval.readers.read_lm_eval_items`): a multiple-choice
doc keeps lm-eval's exact context as ``prompt``, its choices and the gold, so ``mc-loglik`` / ``mc-loglik-norm``
are lm-eval's ``acc`` / ``acc_norm`` on the same requests; item ids are ``<task>/<doc_id>``, as in lm-eval's
samples. A ``generate_until`` doc keeps its context, its request's generation settings and the task's filters,
metrics and gold as data (:mod:`certeval.lm_eval_scoring`), so the ``lm-eval`` scorer generates and judges it as
lm-eval does; any other request type is refused in one line.

The YAML is the user's own task: loading it runs what it names (``!function`` hooks), as ``lm_eval`` itself does.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import pandas as pd

from .estimators._validation import InputError

TASK_SUFFIXES = (".yaml", ".yml")
FEWSHOT_SEED = 1234  # lm-eval's default (simple_evaluate's fewshot_random_seed): its few-shot examples, not others


def is_task_yaml(location: str | None) -> bool:
    return bool(location) and str(location).lower().endswith(TASK_SUFFIXES)


def _task_name(manager, path: Path) -> str:
    """The one task the YAML defines, as lm-eval's index of its folder records it."""
    resolved = path.resolve()
    names = [name for name, entry in manager.task_index.items()
             if Path(str(getattr(entry, "yaml_path", "") or "")).resolve() == resolved]
    kinds = {name: str(getattr(manager.task_index[name], "kind", "")).lower() for name in names}
    tasks = [name for name in names if "group" not in kinds[name] and "tag" not in kinds[name]]
    if len(tasks) != 1:
        found = ", ".join(f"{n} ({kinds[n] or 'task'})" for n in names) or "nothing lm-eval could index"
        raise InputError(f"lm-eval task {str(path)!r} must define exactly one task ('task: NAME'); it defines "
                         f"{found}; a group of tasks is not a bank yet, give one task's YAML")
    return tasks[0]


def _records(task, name: str) -> list[dict]:
    """lm-eval's requests grouped per doc, as its samples files record them (doc_id, doc, target, arguments)."""
    by_doc: dict[int, dict] = {}
    for instance in sorted(task.instances, key=lambda i: (i.doc_id, i.idx)):
        rec = by_doc.setdefault(instance.doc_id, {"doc_id": instance.doc_id, "doc": instance.doc,
                                                   "target": task.doc_to_target(instance.doc), "arguments": []})
        rec["arguments"].append(list(instance.arguments))
    if not by_doc:
        raise InputError(f"lm-eval task {name!r} built no request (an empty split?)")
    return [by_doc[k] for k in sorted(by_doc)]


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


def load_task_items(location: str) -> pd.DataFrame:
    """The items of one lm-eval task YAML (see the module docstring)."""
    from .lm_eval_scoring import item_fields, task_scoring
    from .readers import GENERATE_UNTIL, _lm_eval_item

    path = Path(location).expanduser()
    if not path.is_file():
        raise InputError(f"lm-eval task {location!r} does not exist (give the task's YAML file)")
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise InputError(f"--tasks {location!r} is an lm-eval task; it needs the package lm-eval") from None
    try:  # the YAML's folder only: indexing lm-eval's ~14,000 built-in tasks takes half a minute
        manager = TaskManager(include_path=str(path.parent), include_defaults=False)
    except Exception as exc:
        raise InputError(f"lm-eval could not read the tasks in {str(path.parent)!r}: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    name = _task_name(manager, path)
    try:
        with _quiet():
            task = manager.load([name])["tasks"][name]
            task.set_fewshot_seed(seed=FEWSHOT_SEED)
            task.build_all_requests(limit=None, rank=0, world_size=1)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"lm-eval could not build task {name!r} from {location!r}: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    where = f"lm-eval task {location}"
    records = _records(task, name)
    items = [_lm_eval_item(where, name, rec) for rec in records]
    if any(GENERATE_UNTIL in item for item in items):
        scoring = task_scoring(task, name)
        for item, rec in zip(items, records):
            item.update(item_fields(task, name, scoring, rec["doc"], rec["arguments"][0][1]))
    return pd.DataFrame(items)
