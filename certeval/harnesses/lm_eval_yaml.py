"""A task YAML read as data, before lm-eval reads it: the static checks of ``--tasks`` (issue 48).

lm-eval's own loader imports every ``!function`` module while it parses a YAML and only then finds a missing file,
an unknown output type or a dataset that is not there, as a traceback from deep inside ``datasets``. These checks
parse the YAML with a safe loader that keeps ``!function module.name`` as a reference (nothing is imported or
executed: the module's source is only parsed to find the name) and refuse, in one line naming ``--tasks`` and the
value, what lm-eval would fail on later: YAML that does not parse or is not a mapping, a missing ``include``, an
unknown ``output_type``, a ``num_fewshot`` that is not a whole number >= 0, a ``!function`` whose file or name is
missing, a local dataset file that is missing or empty, a group with no task.
"""

from __future__ import annotations

import ast
import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from certeval.errors import InputError

OUTPUT_TYPES = ("loglikelihood", "multiple_choice", "loglikelihood_rolling", "generate_until")  # lm-eval 0.4
LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow")  # datasets' builders that read data_files
MAX_YAML_BYTES = 1 << 20  # a task YAML (or a file it includes) is configuration, not data
MAX_INCLUDES = 8  # include: chains deeper than this are a loop
MAX_FEWSHOT = 10_000


@dataclass(frozen=True)
class FunctionRef:
    """``!function module.name``, kept as text."""

    text: str


def _loader(path: Path):
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: FunctionRef(str(loader.construct_scalar(node))))
    return Loader


def _bad(flag: str, value: str, message: str) -> InputError:
    return InputError(f"{flag} {value!r}: {message}")


def read_yaml(path: Path, flag: str, value: str) -> Any:
    """The YAML at ``path`` as data (``!function`` kept as :class:`FunctionRef`); InputError when it cannot be."""
    import yaml

    try:
        st = path.stat()
    except OSError as exc:
        raise _bad(flag, value, f"{str(path)!r} cannot be read ({exc.strerror or type(exc).__name__})") from None
    if not path.is_file():
        raise _bad(flag, value, f"{str(path)!r} is not a file")
    if st.st_size > MAX_YAML_BYTES:
        raise _bad(flag, value, f"{str(path)!r} declares {st.st_size} bytes, over the {MAX_YAML_BYTES} a task YAML "
                                "is read with")
    try:
        text = path.read_bytes().decode("utf-8")
        return yaml.load(text, Loader=_loader(path))  # noqa: S506 - a SafeLoader subclass
    except UnicodeDecodeError as exc:
        raise _bad(flag, value, f"{str(path)!r} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise _bad(flag, value, f"{str(path)!r} cannot be read ({exc.strerror or type(exc).__name__})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise _bad(flag, value, f"{str(path)!r} is not valid YAML{where}: {problem}") from None


def task_config(path: Path, flag: str, value: str, depth: int = 0) -> dict:
    """The YAML's mapping with its ``include`` chain merged in (its own keys win), as lm-eval merges it."""
    data = read_yaml(path, flag, value)
    if not isinstance(data, dict):
        raise _bad(flag, value, f"{str(path)!r} is not a task: its YAML is a {type(data).__name__}, not a mapping "
                                "(task: NAME, dataset_path: ...)")
    include = data.get("include")
    if include is None:
        return data
    if depth >= MAX_INCLUDES:
        raise _bad(flag, value, f"{str(path)!r}: include chain deeper than {MAX_INCLUDES} (a loop?)")
    if not isinstance(include, str) or not include:
        raise _bad(flag, value, f"{str(path)!r}: include must name a file, got {include!r}")
    base = Path(include) if os.path.isabs(include) else path.parent / include
    if not base.is_file():
        raise _bad(flag, value, f"{str(path)!r} includes {include!r}, which does not exist")
    merged = task_config(base, flag, value, depth + 1)
    merged.update({k: v for k, v in data.items() if k != "include"})
    return merged


def _function_refs(node: Any) -> list[str]:
    if isinstance(node, FunctionRef):
        return [node.text]
    if isinstance(node, dict):
        return [ref for v in node.values() for ref in _function_refs(v)]
    if isinstance(node, list):
        return [ref for v in node for ref in _function_refs(v)]
    return []


def _defines(source: str, name: str) -> bool:
    """Whether a module's source binds ``name`` at top level (parsed, never run)."""
    for stmt in ast.parse(source).body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name:
            return True
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in stmt.names):
                return True
    return False


def _check_function(ref: str, folder: Path, flag: str, value: str) -> None:
    module, _, name = ref.rpartition(".")
    if not module or not name:
        raise _bad(flag, value, f"!function {ref!r} must name module.function")
    source_path = folder / f"{module}.py"  # lm-eval's rule: the module file beside the YAML
    if not source_path.is_file():
        raise _bad(flag, value, f"!function {ref!r}: {str(source_path)!r} does not exist")
    try:
        source = source_path.read_text(encoding="utf-8")
        found = _defines(source, name)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        raise _bad(flag, value, f"!function {ref!r}: {str(source_path)!r} is not readable Python "
                                f"({type(exc).__name__})") from None
    if not found:
        raise _bad(flag, value, f"!function {ref!r}: {str(source_path)!r} defines no {name!r}")


def _data_files(spec: Any) -> list[str]:
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, list):
        return [f for item in spec for f in _data_files(item)]
    if isinstance(spec, dict):
        return [f for item in spec.values() for f in _data_files(item)]
    return []


def _check_dataset(config: dict, flag: str, value: str) -> None:
    dataset = config.get("dataset_path")
    if dataset is None:
        return
    if not isinstance(dataset, str) or not dataset:
        raise _bad(flag, value, f"dataset_path must name a dataset, got {dataset!r}")
    kwargs = config.get("dataset_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise _bad(flag, value, f"dataset_kwargs must be a mapping, got {kwargs!r}")
    if dataset in LOCAL_BUILDERS:
        files = _data_files(kwargs.get("data_files"))
        for name in files:
            if "://" in name:
                continue
            matched = sorted(glob.glob(os.path.expanduser(name))) if glob.has_magic(name) else [name]
            if not matched or not all(os.path.exists(m) for m in matched):
                raise _bad(flag, value, f"dataset file {name!r} does not exist")
            for match in matched:
                if not os.path.isfile(match):
                    raise _bad(flag, value, f"dataset file {match!r} is not a file")
                if os.path.getsize(match) == 0:
                    raise _bad(flag, value, f"dataset file {match!r} is empty (no docs)")
    elif dataset.startswith(("/", "./", "../", "~")) and not os.path.exists(os.path.expanduser(dataset)):
        raise _bad(flag, value, f"dataset_path {dataset!r} does not exist")


def check_num_fewshot(count: Any, flag: str, value: str) -> int | None:
    """A few-shot count: a whole number in [0, MAX_FEWSHOT] (booleans and text are not counts)."""
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_FEWSHOT:
        raise _bad(flag, value, f"num_fewshot must be a whole number in [0, {MAX_FEWSHOT}], got {count!r}")
    return count


def check_task_yaml(path: str | Path, flag: str = "--tasks", value: str | None = None) -> dict:
    """Every static check of one task or group YAML (module docstring); returns its merged mapping."""
    path = Path(path)
    value = str(path) if value is None else value
    config = task_config(path, flag, value)
    if "task" not in config and "group" not in config:
        raise _bad(flag, value, f"{str(path)!r} defines no task or group ('task: NAME' or 'group: NAME')")
    if "group" in config:
        members = config.get("task")
        if not isinstance(members, list) or not members:
            raise _bad(flag, value, f"group {config['group']!r} holds no task (its 'task:' list is empty)")
    output_type = config.get("output_type")
    if output_type is not None and output_type not in OUTPUT_TYPES:
        raise _bad(flag, value, f"output_type {output_type!r} is not one lm-eval knows ({', '.join(OUTPUT_TYPES)})")
    check_num_fewshot(config.get("num_fewshot"), flag, value)
    if "task" in config and "group" not in config:
        from .lm_eval_metric_names import check_metric_names

        check_metric_names(config, flag, value)
    for ref in _function_refs(config):
        _check_function(ref, path.parent, flag, value)
    _check_dataset(config, flag, value)
    return config
