"""Readers for results other harnesses write, as certeval's long scores table (``model, item_id, score, subset``).

lm-evaluation-harness ``--log_samples`` writes ``<output_path>/<model name>/samples_<task>_<timestamp>.jsonl``:
one JSON object per line with ``doc_id``, ``doc``, ``target``, ``arguments``, ``resps``,
``filtered_resps``, ``doc_hash``, ``prompt_hash``, ``target_hash`` and one key per metric (``acc``,
``acc_norm``, ``exact_match``, …). Each line becomes one score: ``item_id`` = ``<task>/<doc_id>``,
``subset`` = the task, ``model`` = the folder's name (lm-eval names it after the model), ``score`` = the
metric (the first metric key of the file unless ``metric`` names one); values must be numbers in [0, 1].
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath

import pandas as pd

from .estimators._validation import InputError
from .storage import filesystem

LM_EVAL_FIELDS = {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "doc_hash", "prompt_hash",
                  "target_hash", "task", "filter", "metrics"}
SAMPLES_NAME = re.compile(r"^samples_(?P<task>.+?)_(?P<stamp>\d{4}-\d{2}-\d{2}T[\d\-.:]+)\.jsonl$")


def is_lm_eval_samples(path: str) -> bool:
    return bool(SAMPLES_NAME.match(PurePosixPath(str(path)).name))


def read_lm_eval_samples(path: str, metric: str | None = None) -> pd.DataFrame:
    """One lm-eval samples file as a scores table (see the module docstring)."""
    name = PurePosixPath(str(path)).name
    match = SAMPLES_NAME.match(name)
    if not match:
        raise InputError(f"{path!r} is not an lm-eval samples file (samples_<task>_<timestamp>.jsonl)")
    task = match.group("task")
    model = PurePosixPath(str(path)).parent.name or "model"
    fs, local = filesystem(str(path))
    try:
        with fs.open(local, "r") as fh:
            lines = [line for line in fh if line.strip()]
    except FileNotFoundError:
        raise InputError(f"lm-eval samples file {path!r} does not exist") from None
    if not lines:
        raise InputError(f"lm-eval samples file {path!r} is empty")
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise InputError(f"{path!r} line {number} is not JSON") from None
        if "doc_id" not in rec:
            raise InputError(f"{path!r} line {number} has no doc_id (not an lm-eval sample)")
        metrics = [k for k in rec if k not in LM_EVAL_FIELDS]
        key = metric or (metrics[0] if metrics else None)
        if key is None or key not in rec:
            raise InputError(f"{path!r} line {number} has no metric {key or ''!r}; metrics there: "
                             f"{', '.join(metrics) or 'none'}")
        value = rec[key]
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise InputError(f"{path!r} line {number}: metric {key!r} is {value!r}, not a number in [0, 1]")
        rows.append({"model": model, "item_id": f"{task}/{rec['doc_id']}", "score": float(value), "subset": task})
    return pd.DataFrame(rows)
