"""Readers for results other harnesses write, as certeval's long scores table (``model, item_id, score, subset``)
and as item banks (``item_id, subset, question, answer``).

lm-evaluation-harness ``--log_samples`` writes ``<output_path>/<model name>/samples_<task>_<timestamp>.jsonl``:
one JSON object per line with ``doc_id``, ``doc``, ``target``, ``arguments``, ``resps``,
``filtered_resps``, ``doc_hash``, ``prompt_hash``, ``target_hash`` and one key per metric (``acc``,
``acc_norm``, ``exact_match``, …). Each line becomes one score: ``item_id`` = ``<task>/<doc_id>``,
``subset`` = the task, ``model`` = the folder's name (lm-eval names it after the model), ``score`` = the
metric (the first metric key of the file unless ``metric`` names one); values must be numbers in [0, 1].
As a bank, a line gives ``question`` (the doc's question/query/text field, else the first argument's
context) and ``answer`` (``target``).

Inspect AI logs (``.eval`` and ``.json``) are read with inspect_ai's own reader (``read_eval_log``, an optional
dependency). One log holds one model's samples of one task: ``item_id`` = ``<task>/<sample id>``, ``score`` =
the chosen scorer's value (the first scorer unless ``metric`` names one) mapped to [0, 1] with Inspect's value
semantics (``C``/``I``/``P``/``N`` → 1/0/0.5/0, booleans, ``yes``/``no``/``true``/``false``, numbers); anything
else is an error, never a silent 0. With several epochs a sample's score is the mean over its epochs.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath

import pandas as pd

from certeval.errors import InputError
from certeval.storage import check_file, open_file, read_file

LM_EVAL_FIELDS = {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "doc_hash", "prompt_hash",
                  "target_hash", "task", "filter", "metrics",
                  "item_id", "round", "prob"}  # the last three: certeval's own --log_samples files
SAMPLES_NAME = re.compile(r"^samples_(?P<task>.+?)_(?P<stamp>\d{4}-\d{2}-\d{2}T[\d\-.:]+)\.jsonl$")


SCORE_WORDS = {"c": 1.0, "i": 0.0, "p": 0.5, "n": 0.0, "yes": 1.0, "no": 0.0, "true": 1.0, "false": 0.0}
MAX_EVAL_LOG_BYTES = 2 << 30  # an .eval log's members, unpacked: refused beyond this before reading
MAX_SAMPLES_BYTES = 2 << 30  # an lm-eval samples file: refused from its declared size before it is read
MAX_RESULTS_BYTES = 256 << 20  # an lm-eval results file (a summary: kilobytes)


def is_lm_eval_samples(path: str) -> bool:
    return bool(SAMPLES_NAME.match(PurePosixPath(str(path)).name))


def _lm_eval_records(path: str) -> tuple[str, str, list[dict]]:
    """(task, model, records) of one lm-eval samples file."""
    name = PurePosixPath(str(path)).name
    match = SAMPLES_NAME.match(name)
    if not match:
        raise InputError(f"{path!r} is not an lm-eval samples file (samples_<task>_<timestamp>.jsonl)")
    task = match.group("task")
    model = PurePosixPath(str(path)).parent.name or "model"
    try:
        raw = read_file(str(path), "lm-eval samples file", MAX_SAMPLES_BYTES)
    except OSError as exc:
        raise InputError(f"lm-eval samples file {path!r} cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        lines = [line for line in raw.decode("utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as exc:
        raise InputError(f"lm-eval samples file {path!r} is not UTF-8 text (byte {exc.start}: "
                         f"{raw[exc.start:exc.start + 1]!r})") from None
    if not lines:
        raise InputError(f"lm-eval samples file {path!r} is empty")
    records = []
    for number, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise InputError(f"lm-eval samples file {path!r} line {number} is not JSON") from None
        if not isinstance(rec, dict) or "doc_id" not in rec:
            raise InputError(f"lm-eval samples file {path!r} line {number} has no doc_id (not an lm-eval sample)")
        records.append(rec)
    return task, model, _first_filter(records)


def _first_filter(records: list[dict]) -> list[dict]:
    """The lines of the file's first filter: lm-eval (and certeval) write a generation task's doc once per filter,
    each line scored after its own filter; one item is one score."""
    first = records[0].get("filter")
    return [rec for rec in records if rec.get("filter") == first]


def read_lm_eval_samples(path: str, metric: str | None = None) -> pd.DataFrame:
    """One lm-eval samples file as a scores table (see the module docstring)."""
    task, model, records = _lm_eval_records(path)
    rows = []
    for number, rec in enumerate(records, 1):
        metrics = [k for k in rec if k not in LM_EVAL_FIELDS]
        key = metric or (metrics[0] if metrics else None)
        if key is None or key not in rec:
            raise InputError(f"lm-eval samples file {path!r} line {number} has no metric {key or ''!r}; metrics there: "
                             f"{', '.join(metrics) or 'none'}")
        value = rec[key]
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise InputError(f"lm-eval samples file {path!r} line {number}: metric {key!r} is {value!r}, not a number "
                             "in [0, 1]")
        rows.append({"model": model, "item_id": _item_id(task, rec), "score": float(value), "subset": task})
    return pd.DataFrame(rows)


def _item_id(task: str, rec: dict) -> str:
    """``<task>/<doc_id>``; certeval's own samples files carry the bank's ``item_id``."""
    return str(rec["item_id"]) if "item_id" in rec else f"{task}/{rec['doc_id']}"


def _lm_eval_question(rec: dict) -> str:
    doc = rec.get("doc")
    if isinstance(doc, dict):
        for key in ("question", "query", "problem", "prompt", "text", "sentence", "context", "input"):
            if isinstance(doc.get(key), str):
                return doc[key]
    args = rec.get("arguments")
    if isinstance(args, dict):  # newer lm-eval: {"gen_args_0": {"arg_0": context, "arg_1": ...}, ...}
        args = list(args.values())
    first = args[0] if isinstance(args, list) and args else None
    if isinstance(first, dict):
        first = first.get("arg_0")
    elif isinstance(first, (list, tuple)) and first:
        first = first[0]
    return first if isinstance(first, str) else json.dumps(doc, default=str)


GENERATE_UNTIL = "lm_eval_generate_until"  # bank column: the item was an lm-eval generate_until request


def read_lm_eval_items(path: str) -> pd.DataFrame:
    """One lm-eval samples file as an item bank that certeval scores the way lm-eval did.

    A multiple-choice item (one log-likelihood request per choice, one shared context) keeps lm-eval's exact
    context as ``prompt``, its choices (the continuations without lm-eval's default " " delimiter) and the gold
    choice, so certeval's ``mc-loglik`` / ``mc-loglik-norm`` judges are lm-eval's ``acc`` / ``acc_norm``. A
    ``generate_until`` item keeps its context and target but is marked (``lm_eval_generate_until``): lm-eval's
    filters and metric are not in the samples file, so it runs only with a scorer the user names. Any other
    request (a single log-likelihood, a rolling one, another delimiter) is refused."""
    task, _, records = _lm_eval_records(path)
    return pd.DataFrame([_lm_eval_item(path, task, rec) for rec in records])


def _lm_eval_arguments(rec: dict) -> list[tuple]:
    """A record's requests as (context, continuation or generation kwargs) tuples, old and new layouts."""
    args = rec.get("arguments")
    if isinstance(args, dict):  # newer lm-eval: {"gen_args_0": {"arg_0": context, "arg_1": ...}, ...}
        args = [tuple(v.get(k) for k in sorted(v)) if isinstance(v, dict) else v for v in args.values()]
    return [tuple(a) for a in args if isinstance(a, (list, tuple))] if isinstance(args, list) else []


def _lm_eval_item(path: str, task: str, rec: dict) -> dict:
    where = f"{path!r} doc {rec.get('doc_id')!r}"
    row = {"item_id": _item_id(task, rec), "subset": task, "question": _lm_eval_question(rec)}
    args = _lm_eval_arguments(rec)
    mc = len(args) >= 2 and all(len(a) == 2 and isinstance(a[0], str) and isinstance(a[1], str) for a in args)
    if (mc or "task_choices" in rec) and len({a[0] for a in args}) == 1:
        return {**row, **_mc_fields(where, rec, args)}
    if len(args) == 1 and len(args[0]) == 2 and isinstance(args[0][0], str) and isinstance(args[0][1], dict):
        return {**row, "prompt": args[0][0], "answer": _text(rec.get("target")), GENERATE_UNTIL: True}
    raise InputError(f"{where}: an lm-eval request certeval cannot score the way lm-eval did (neither multiple "
                     "choice by log-likelihood nor generate_until); use its recorded scores instead (certeval "
                     "import lm-eval, or the samples file as --scores / replay)")


def _mc_fields(where: str, rec: dict, args: list[tuple]) -> dict:
    """A multiple-choice doc's prompt, choices, the exact continuations lm-eval scores and its gold index(es)
    (:mod:`certeval.scoring.lm_eval_gold`). A task built by lm-eval gives its choices (``doc_to_choice``), its target and
    whether it reads several golds; a samples file gives the continuations and ``str(target)`` only, so its
    choices are the continuations without lm-eval's default " " delimiter (another delimiter is refused)."""
    from certeval.scoring.lm_eval_gold import gold_indices, samples_target
    from certeval.scoring.scorers import CONTINUATIONS, GOLD

    continuations = [a[1] for a in args]
    if "task_choices" in rec:  # built by lm-eval's Task (certeval.harnesses.lm_eval_tasks)
        choices, target, several = [str(c) for c in rec["task_choices"]], rec.get("target"), bool(rec.get("several"))
        if len(choices) != len(continuations):
            raise InputError(f"{where}: {len(continuations)} requests for {len(choices)} choices; certeval scores "
                             "one request per choice")
    else:
        if not all(c.startswith(" ") for c in continuations):
            raise InputError(f"{where}: its choices do not follow lm-eval's default ' ' delimiter "
                             f"({continuations[0]!r}); a samples file does not say which delimiter its task used: "
                             "give the task YAML (--tasks) instead")
        choices, target = [c[1:] for c in continuations], samples_target(rec.get("target"))
        several = isinstance(target, list)
    golds = gold_indices(target, choices, several, where)
    fields = {"prompt": args[0][0], "choices": choices, CONTINUATIONS: continuations, GOLD: golds}
    return {**fields, "answer": golds[0]} if not several else fields


def _text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return " | ".join(value)
    return json.dumps(value, default=str)


# --------------------------------------------------------------------------------------------
# Inspect AI logs
# --------------------------------------------------------------------------------------------


def is_inspect_log(path: str) -> bool:
    """``.eval`` files always; ``.json`` files when they look like an Inspect log (top-level ``eval``)."""
    lower = str(path).lower()
    if lower.endswith(".eval"):
        return True
    if not lower.endswith(".json"):
        return False
    try:
        with open_file(str(path), "Inspect log", MAX_EVAL_LOG_BYTES) as fh:
            head = fh.read(4096)
    except (InputError, OSError):  # not a readable regular file: not a log (its reader names the problem)
        return False
    return bool(re.match(rb'\s*\{\s*"(version|status|eval)"', head)) and b'"eval"' in head


def score_value(value, where: str) -> float:
    """An Inspect score value in [0, 1] with Inspect's value semantics; InputError for anything else."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        word = value.strip().lower()
        if word in SCORE_WORDS:
            return SCORE_WORDS[word]
        try:
            number = float(word)
        except ValueError:
            raise InputError(f"{where}: score value {value!r} is not a number nor C/I/P/N/yes/no/true/false") from None
    else:
        raise InputError(f"{where}: score value {value!r} is not numeric (a {type(value).__name__}); "
                         "pick a scorer with a scalar value (--metric)")
    if not 0.0 <= number <= 1.0:
        raise InputError(f"{where}: score value {value!r} is outside [0, 1]")
    return number


def _read_inspect(path: str):
    try:
        from inspect_ai.log import read_eval_log
    except ImportError:
        raise InputError(f"{path!r} is an Inspect log; reading it needs the optional package inspect-ai "
                         "(pip install 'certeval[inspect]')") from None
    check_file(str(path), "Inspect log", MAX_EVAL_LOG_BYTES)
    if str(path).lower().endswith(".eval"):
        _check_declared_size(path)
    try:
        return read_eval_log(str(path))
    except Exception as exc:  # a damaged log: one line, not a traceback
        raise InputError(f"Inspect log {path!r} could not be read: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None


def _check_declared_size(path: str) -> None:
    """An ``.eval`` log is a zip archive: refuse it from its members' declared sizes, before anything is unpacked
    (a small file can declare gigabytes; reading stops at the declared size, so the declared total bounds it)."""
    import zipfile

    try:
        with open_file(str(path), "Inspect log", MAX_EVAL_LOG_BYTES) as fh, zipfile.ZipFile(fh) as archive:
            total = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(f"Inspect log {path!r} is not a readable .eval archive ({exc})") from None
    if total > MAX_EVAL_LOG_BYTES:
        raise InputError(f"Inspect log {path!r}: its members declare {total} bytes unpacked, over the "
                         f"{MAX_EVAL_LOG_BYTES} bytes a log is read with; refused before unpacking")


def _inspect_samples(path: str, log) -> list:
    samples = list(log.samples or [])
    if not samples:
        raise InputError(f"Inspect log {path!r} has no samples (status {log.status!r}); run the eval with "
                         "samples logged")
    return samples


def read_inspect_log(path: str, metric: str | None = None) -> pd.DataFrame:
    """One Inspect log as a scores table (see the module docstring)."""
    log = _read_inspect(path)
    task = log.eval.task
    model = str(log.eval.model)
    by_item: dict[str, list[float]] = {}
    scorer = metric
    samples = _inspect_samples(path, log)
    generators = sorted({str(s.output.model) for s in samples if getattr(s.output, "model", None)})
    if len(generators) > 1:
        raise InputError(f"Inspect log {path!r} mixes models ({', '.join(generators)}); certeval reads one model "
                         "per log")
    for sample in samples:
        where = f"Inspect log {path!r} sample {sample.id!r}"
        if not sample.scores:
            raise InputError(f"{where} has no score (was the eval scored?)")
        if scorer is None:
            scorer = next(iter(sample.scores))
        if scorer not in sample.scores:
            raise InputError(f"{where} has no scorer {scorer!r}; scorers there: {', '.join(sample.scores)}")
        value = sample.scores[scorer].value
        if isinstance(value, dict) and metric is None:
            raise InputError(f"{where}: scorer {scorer!r} gives several values ({', '.join(value)}); "
                             "name one with --metric SCORER")
        by_item.setdefault(f"{task}/{sample.id}", []).append(score_value(value, where))
    return pd.DataFrame([{"model": model, "item_id": item, "score": sum(v) / len(v), "subset": task}
                         for item, v in by_item.items()])


def read_inspect_items(path: str) -> pd.DataFrame:
    """One Inspect log as an item bank: ``item_id, subset, question, answer`` (sample input and target), and
    ``choices`` where its samples have them (a multiple-choice task: the target is the choice's letter)."""
    log = _read_inspect(path)
    task = log.eval.task
    rows = {}
    for sample in _inspect_samples(path, log):
        question = sample.input if isinstance(sample.input, str) else "\n".join(
            str(getattr(m, "text", m)) for m in sample.input)
        row = {"item_id": f"{task}/{sample.id}", "subset": task, "question": question, "answer": _text(sample.target)}
        if getattr(sample, "choices", None):
            row["choices"] = [str(c) for c in sample.choices]
        rows.setdefault(row["item_id"], row)
    return pd.DataFrame(list(rows.values()))


def read_harness_items(paths) -> pd.DataFrame:
    """Item text from lm-eval samples files and Inspect logs; an item seen twice keeps its first text."""
    frames = [read_lm_eval_items(str(p)) if is_lm_eval_samples(str(p)) else read_inspect_items(str(p))
              for p in paths]
    return pd.concat(frames, ignore_index=True).drop_duplicates("item_id")
