"""lm-eval's ``--output_path`` tree as runs, each named after the model its results file records.

lm-eval 0.4 writes one run as ``<output_path>/<model_name_sanitized>/results_<timestamp>.json`` plus one
``samples_<task>_<timestamp>.jsonl`` per task, all with the run's one timestamp. The folder's name comes from
``model_args`` alone, so two runs of one model with other ``model_args`` share a folder; the results file's
``config`` (``model``, ``model_args``) tells them apart.

Naming rule: a run's name is the ``model_args`` value lm-eval names its folder after (``peft``, ``delta``,
``pretrained``, ``model``, ``path``, ``engine``, in that order), else ``<model> (<k=v, …>)``. Runs whose names
coincide but whose settings (``--model``, ``model_args``, ``gen_kwargs``, chat template, system instruction)
differ get the keys that differ appended: ``m (dtype=float16)``, ``m (no dtype)``. Runs still named alike merge
only when their settings are the same and no task is in two of them (one model, tasks run at different times);
otherwise each gets ``@<timestamp>``. A samples file without its results file, or given directly, is named after
its folder (lm-eval's folder name), as before.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from certeval.errors import InputError
from certeval.storage import check_file, filesystem, is_local, read_file
from certeval.storage.io import bounded

from .readers import MAX_RESULTS_BYTES, MAX_SAMPLES_BYTES, SAMPLES_NAME

RESULTS_NAME = re.compile(r"^(?P<stem>.+)_(?P<stamp>\d{4}-\d{2}-\d{2}T[\d\-.:]+)\.json$")
NAME_KEYS = ("peft", "delta", "pretrained", "model", "path", "engine")  # lm-eval's order for its folder name
SETTING_FIELDS = ("chat_template_sha", "system_instruction_sha", "fewshot_as_multiturn")  # top level, when set
FROM_RESULTS, FROM_FOLDER, FROM_FILE, FROM_OPTION = ("results file config", "folder name (no results file)",
                                                   "folder name (samples file given directly)", "--name")


@dataclass
class Run:
    """One lm-eval run: its samples files (one per task), its results file and the model name chosen."""

    folder: str
    stamp: str
    samples: list[str] = field(default_factory=list)
    results: str | None = None
    settings: dict[str, str] | None = None
    source: str = FROM_FOLDER
    name: str = ""

    @property
    def tasks(self) -> set[str]:
        return {SAMPLES_NAME.match(p.rpartition("/")[2]).group("task") for p in self.samples}

    def describe(self) -> dict:
        return {"model": self.name, "named_from": self.source, "results": self.results, "samples": self.samples,
                "settings": self.settings}


def _text(value) -> str:
    """A setting's value as stable text: lm-eval's CLI records ``seed=1`` as 1, its Python API as "1"."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _model_args(raw, path: str) -> dict[str, str]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return {str(k): _text(v) for k, v in raw.items()}
    if isinstance(raw, str):  # "k=v,k2=v2", split as lm-eval splits it
        pairs = [arg.split("=", 1) for arg in raw.split(",") if arg.strip()]
        return {p[0].strip(): (p[1] if len(p) > 1 else "") for p in pairs}
    raise InputError(f"lm-eval results file {path!r}: config.model_args is {raw!r}, neither text nor a mapping")


def read_settings(path: str) -> dict[str, str]:
    """What made a run's model: ``--model``, its ``model_args`` and the generation settings lm-eval records."""
    try:
        data = json.loads(read_file(path, "lm-eval results file", MAX_RESULTS_BYTES))
    except (OSError, ValueError) as exc:
        raise InputError(f"lm-eval results file {path!r} could not be read: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    config = data.get("config") if isinstance(data, dict) else None
    if not isinstance(config, dict) or not isinstance(config.get("model"), str):
        raise InputError(f"lm-eval results file {path!r} has no config.model (not an lm-eval results file?)")
    settings = {"--model": config["model"], **_model_args(config.get("model_args"), path)}
    if config.get("gen_kwargs"):
        settings["gen_kwargs"] = _text(config["gen_kwargs"])
    for key in SETTING_FIELDS:
        # fewshot_as_multiturn acts only with a chat template (without one lm-eval 0.4.13's CLI records null, its
        # Python API True)
        if data.get(key) and (key != "fewshot_as_multiturn" or data.get("chat_template_sha")):
            settings[key] = _text(data[key])
    return settings


def base_name(run: Run) -> str:
    if run.settings is None:
        return run.folder.rpartition("/")[2] or "model"
    args = {k: v for k, v in run.settings.items() if k not in ("--model", "gen_kwargs", *SETTING_FIELDS)}
    for key in NAME_KEYS:
        if args.get(key):
            return args[key]
    listed = ", ".join(f"{k}={v}" for k, v in sorted(args.items()))
    return f"{run.settings['--model']} ({listed})" if listed else run.settings["--model"]


def _differing(runs: list[Run]) -> list[str]:
    keys = sorted({k for r in runs for k in r.settings})
    return [k for k in keys if len({r.settings.get(k) for r in runs}) > 1]


def _suffix(run: Run, keys: list[str]) -> str:
    if run.settings is None or not keys:
        return ""
    return " (" + ", ".join(f"{k}={run.settings[k]}" if k in run.settings else f"no {k}" for k in keys) + ")"


def _merge_is_safe(runs: list[Run]) -> bool:
    """Runs named alike are one model when nothing tells them apart and no task was run twice."""
    same = all(r.settings == runs[0].settings for r in runs)
    tasks = [t for r in runs for t in r.tasks]
    return same and len(tasks) == len(set(tasks))


def _group(runs: list[Run], key) -> list[list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(key(run), []).append(run)
    return list(groups.values())


def name_runs(runs: list[Run]) -> None:
    """Apply the naming rule (module docstring); InputError when two runs still cannot be told apart."""
    for group in _group(runs, base_name):
        keys = _differing([r for r in group if r.settings is not None])
        for run in group:
            run.name = base_name(run) + _suffix(run, keys)
    for group in _group(runs, lambda r: r.name):
        if len(group) > 1 and not _merge_is_safe(group):
            for run in group:
                run.name += f" @{run.stamp}"
    for group in _group(runs, lambda r: r.name):
        if len(group) > 1 and not _merge_is_safe(group):  # the same timestamp in two folders: copies of one run
            raise InputError(f"the runs of {group[0].samples[0]!r} and {group[1].samples[0]!r} would both be "
                             f"named {group[0].name!r}; import them separately")


def _urls(fs, found: list[str]) -> list[str]:
    return sorted(found if is_local(fs) else [fs.unstrip_protocol(p) for p in found])


def walk(folder: str) -> list[Run]:
    """The runs below one folder: samples files paired with the results file of their folder and timestamp."""
    fs, local = filesystem(folder)
    files = _local_files(local, folder) if is_local(fs) else _urls(fs, list(bounded(fs, "find", local)))
    if not files:
        raise InputError(f"lm-eval PATH {folder!r} is a folder with no files in it; give lm-eval's --output_path "
                         "(or a folder below it) or a samples file")
    runs: dict[tuple[str, str], Run] = {}
    results: dict[tuple[str, str], list[str]] = {}
    for path in files:
        parent, _, name = path.rpartition("/")  # not PurePosixPath: it folds a URL's "//"
        samples, result = SAMPLES_NAME.match(name), RESULTS_NAME.match(name)
        if samples:
            key = (parent, samples.group("stamp"))
            runs.setdefault(key, Run(folder=parent, stamp=key[1])).samples.append(path)
        elif result and not name.startswith("samples_"):
            results.setdefault((parent, result.group("stamp")), []).append(path)
    if not runs:
        raise InputError(f"lm-eval folder {folder!r} holds no samples file (samples_<task>_<timestamp>.jsonl); "
                         "was lm-eval run with --log_samples?")
    for run in runs.values():  # every size is checked before any file is read
        for path in run.samples:
            check_file(path, "lm-eval samples file", MAX_SAMPLES_BYTES)
    for paths in results.values():
        for path in paths:
            check_file(path, "lm-eval results file", MAX_RESULTS_BYTES)
    for key, run in runs.items():
        _pair(run, results.get(key, []))
    return list(runs.values())


MAX_ENTRIES = 1_000_000  # files and folders one lm-eval PATH may hold


def _local_files(root: str, given: str) -> list[str]:
    """Every file below a local folder, links followed (a run linked into lm-eval's tree counts), each folder read
    once: a link back to a folder already read (a loop, or a second link to it) is refused in one line."""
    import os

    seen: dict[tuple[int, int], str] = {}
    files: list[str] = []
    stack, count = [root], 0
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder)
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise InputError(f"lm-eval PATH {given!r}: the folder {folder!r} cannot be read "
                             f"({exc.strerror or type(exc).__name__})") from None
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise InputError(f"lm-eval PATH {given!r}: {folder!r} leads back to {seen[key]!r}, a folder already "
                             "read (a symlink loop, or a second link to it); remove the link")
        seen[key] = folder
        for entry in entries:
            count += 1
            if count > MAX_ENTRIES:
                raise InputError(f"lm-eval PATH {given!r} holds more than {MAX_ENTRIES} files and folders; give "
                                 "lm-eval's --output_path or a folder below it")
            if entry.is_dir(follow_symlinks=True):
                stack.append(entry.path)
            else:  # files, and what is not one (checked by its reader when its name is a samples file's)
                files.append(entry.path)
    return sorted(files)


def _pair(run: Run, results: list[str]) -> None:
    if len(results) > 1:
        raise InputError(f"lm-eval folder {run.folder!r} holds {len(results)} results files for timestamp "
                         f"{run.stamp!r} ({', '.join(results)}); keep one")
    if results:
        run.results, run.settings, run.source = results[0], read_settings(results[0]), FROM_RESULTS


def is_folder(path: str) -> bool:
    fs, local = filesystem(str(path))
    return bool(bounded(fs, "isdir", local))


def collect_runs(paths: list[str], name: str | None = None) -> list[Run]:
    """The runs of folders and samples files given on the command line, named (``name`` overrides)."""
    runs: list[Run] = []
    for path in map(str, paths):
        if is_folder(path):
            runs.extend(walk(path))
        elif SAMPLES_NAME.match(path.rpartition("/")[2]):
            stamp = SAMPLES_NAME.match(path.rpartition("/")[2]).group("stamp")
            runs.append(Run(folder=path.rpartition("/")[0], stamp=stamp, samples=[path], source=FROM_FILE))
        else:
            raise InputError(f"{path!r} is neither an lm-eval folder nor an lm-eval samples file "
                             "(samples_<task>_<timestamp>.jsonl)")
    _check_read_once(runs)
    if name is not None:
        return _named(runs, name)
    name_runs(runs)
    return runs


def _check_read_once(runs: list[Run]) -> None:
    seen: set[str] = set()
    for path in (p for r in runs for p in r.samples):
        if path in seen:
            raise InputError(f"{path!r} is given twice (directly and in a folder, or in two folders); give it once")
        seen.add(path)


def _named(runs: list[Run], name: str) -> list[Run]:
    """``--name``: one model name for one run (files given directly count by folder and timestamp)."""
    if not name.strip():
        raise InputError(f"--name {name!r} is empty; give the model a name")
    distinct = sorted({(r.folder, r.stamp) for r in runs})
    if len(distinct) > 1:
        raise InputError(f"--name {name!r} names one model, but the inputs hold {len(distinct)} lm-eval runs "
                         f"({', '.join(f'{f}@{s}' for f, s in distinct)}); import one run at a time")
    merged = Run(folder=distinct[0][0], stamp=distinct[0][1], samples=[p for r in runs for p in r.samples],
                 results=runs[0].results, settings=runs[0].settings, source=FROM_OPTION, name=name)
    return [merged]
