"""results.json as a typed, versioned record (docs/architecture.md §5; JSON Schema: docs/results.schema.json).

A run's results.json is a :class:`RunResults` and a stored backtest's is a :class:`BacktestResults`; each is
turned into JSON by its one ``to_json`` and carries ``schema_version`` (:data:`SCHEMA_VERSION`), so a reader can
tell which layout it holds. Readers go through :func:`read_results` (any stored results.json: checks it is an
object and not from a newer schema) and :meth:`RunResults.from_json` (the typed record back). A file written
before the version field existed reads as version 0: same keys, no ``schema_version``.

What changes the version: removing or renaming a top-level key, or changing what one means. Adding an optional
top-level key is a new field here and in the schema file, and keeps the version.

:func:`validate` checks a record against the schema file (it needs ``jsonschema`` and a checkout's ``docs/``): the
test suite wraps every ``to_json`` with it (tests/conftest.py), so a test whose run writes a results.json the
schema refuses fails there; a user's run never pays for it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .estimators._validation import InputError
from .messages import shown

SCHEMA_VERSION = 1
RUN_KINDS = ("certify", "compare", "rank", "select")
BACKTEST_KIND = "backtest"
SCHEMA_FILE = Path(__file__).resolve().parents[1] / "docs" / "results.schema.json"  # in a checkout of the repo


class ResultsSchemaError(ValueError):
    """A record that the JSON Schema refuses (a bug in what writes results.json, never bad user input)."""


class _Absent:
    """A key the record does not hold (``None`` is a value: ``"pairs": null`` when the pairs are in a file)."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()


@dataclass(frozen=True)
class RunResults:
    """results.json of a ``certify``/``compare``/``rank``/``select`` run (and of a rescore of one).

    Every model's numbers are its look log's last entry (:mod:`certeval.looks`); ``models`` entries, ``results``
    and ``lm_eval`` (lm-eval's own shapes, :mod:`certeval.harness_output`) are plain JSON objects. The fields
    after ``pipeline`` are present only for the kinds that have them (``ABSENT`` otherwise).
    """

    run_id: str
    kind: str
    task: str
    bank: str | None
    target: str
    confidence: float
    seed: int | None
    rounds: int
    done: bool
    reached: bool
    aggregate: Mapping[str, Any]
    models: list[dict[str, Any]]
    results: Mapping[str, Any]
    lm_eval: Mapping[str, Any]
    history: Mapping[str, Any] | None
    config: Mapping[str, Any]
    run_folder: str
    pipeline: Mapping[str, Any]
    # by kind: compare → pairs; rank → ranking + pairs (None with pairs_file); select → selection
    ranking: Any = ABSENT
    pairs: Any = ABSENT
    pairs_file: Any = ABSENT
    selection: Any = ABSENT
    # a rescore: the scorer that judged the outputs again, and where they came from
    scorer: Any = ABSENT
    rescore: Any = ABSENT
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.kind not in RUN_KINDS:
            raise InputError(f"results.json: kind must be one of {', '.join(RUN_KINDS)}, got {self.kind!r}")

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored as results.json: ``schema_version`` first, then the fields in order, absent
        ones left out."""
        out: dict[str, Any] = {"schema_version": self.schema_version}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "schema_version" and value is not ABSENT:
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str = "results.json") -> RunResults:
        """The record of a stored results.json (see :func:`read_results`); an unknown top-level key or a missing
        required one is an :class:`InputError` naming ``where``."""
        obj = read_results(obj, where)
        if obj.get("kind") == BACKTEST_KIND:
            raise InputError(f"{where} holds a backtest summary, not a run's results")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - names)
        if unknown:
            raise InputError(f"{where} has unknown field {unknown[0]!r} (schema_version "
                             f"{obj.get('schema_version', 0)})")
        required = [f.name for f in fields(cls) if f.default is dataclasses.MISSING]
        missing = [name for name in required if name not in obj]
        if missing:
            raise InputError(f"{where} has no {missing[0]!r} field")
        values = dict(obj)
        values.setdefault("schema_version", 0)
        return cls(**values)

    def replace(self, **changes: Any) -> RunResults:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class BacktestResults:
    """results.json of a stored backtest (``--output``): the per-cell summary and how many reps it holds."""

    cells: list[dict[str, Any]]
    n_reps_total: int
    kind: str = BACKTEST_KIND
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "kind": self.kind, "cells": self.cells,
                "n_reps_total": self.n_reps_total}


def read_results(obj: Any, where: str = "results.json") -> dict[str, Any]:
    """A stored results.json, checked to be one this version reads: a JSON object whose ``schema_version`` (0 when
    absent: written before the field existed) is not newer than :data:`SCHEMA_VERSION`."""
    if not isinstance(obj, dict):
        raise InputError(f"{where} is not a JSON object")
    version = obj.get("schema_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InputError(f"{where} has an invalid schema_version {version!r}")
    if version > SCHEMA_VERSION:
        raise InputError(f"{where} has schema_version {version}, newer than this certeval reads "
                         f"({SCHEMA_VERSION}): upgrade certeval to read it")
    return obj


def read_record(obj: Any, where: str = "results.json", *, complete: bool = False) -> dict[str, Any]:
    """A stored results.json read through its type: :func:`read_results`, then a ``kind`` this version knows (a run's
    or a backtest's), no top-level field the record does not have, and a run's ``models`` a non-empty list.
    ``complete``: every required field present too (:meth:`RunResults.from_json`; rescore builds a new record from
    it). InputError naming ``where`` otherwise."""
    obj = read_results(obj, where)
    kind = obj.get("kind", ABSENT)
    if kind is not ABSENT and kind not in (*RUN_KINDS, BACKTEST_KIND):
        raise InputError(f"{where} has kind {shown(kind)}, which this certeval does not know (kinds: "
                         f"{', '.join((*RUN_KINDS, BACKTEST_KIND))})")
    record = BacktestResults if kind == BACKTEST_KIND else RunResults
    unknown = sorted(set(obj) - {f.name for f in fields(record)})
    if unknown:
        raise InputError(f"{where} has unknown field {shown(unknown[0])} (schema_version "
                         f"{obj.get('schema_version', 0)}); it was not written by this version of certeval")
    if record is RunResults:
        if not isinstance(obj.get("models"), list) or not obj["models"]:
            raise InputError(f"{where} lists no models (field 'models' {'missing' if 'models' not in obj else 'empty'})")
        if complete:
            RunResults.from_json(obj, where)
    elif complete or "cells" in obj:
        if not isinstance(obj.get("cells"), list):
            raise InputError(f"{where} holds a backtest summary without its 'cells' list")
    return obj


def load_schema(path: str | Path = SCHEMA_FILE) -> dict[str, Any]:
    """The JSON Schema of results.json (docs/results.schema.json of a checkout)."""
    return json.loads(Path(path).read_text())


def validate(obj: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> None:
    """Check a results.json object (as written: numpy values as Python ones, NaN as null) against the schema;
    raise :class:`ResultsSchemaError` with the first violation's path. Needs ``jsonschema``."""
    import jsonschema

    from .storage.io import dumps  # the one JSON encoder results.json is written with

    plain = json.loads(dumps(obj))
    schema = dict(load_schema() if schema is None else schema)
    if isinstance(plain, dict) and "oneOf" in schema:  # the branch the record's kind names: its errors, not oneOf's
        schema.pop("oneOf")
        schema["$ref"] = "#/$defs/backtest" if plain.get("kind") == BACKTEST_KIND else "#/$defs/run"
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(plain))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ResultsSchemaError(f"results.json does not match {SCHEMA_FILE.name} at {where}: {error.message}")


__all__ = ["ABSENT", "BACKTEST_KIND", "RUN_KINDS", "SCHEMA_FILE", "SCHEMA_VERSION", "BacktestResults",
           "ResultsSchemaError", "RunResults", "load_schema", "read_record", "read_results", "validate"]
