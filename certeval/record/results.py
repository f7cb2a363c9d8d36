"""results.json as a typed, versioned record (docs/architecture.md §5; JSON Schema: :func:`json_schema`).

A run's results.json is a :class:`RunResults`, typed all the way down: each model's estimate (:class:`ModelResult`),
each pair, a ranking and its listing (:class:`RankingResult`), a selection (:class:`SelectionResult`), the run's cost
and time (:class:`Pipeline`, :class:`Phases`), its history, settings and provenance. Where the estimators' own frozen
result is what is stored, it is the type: a pair is a :class:`~certeval.estimators.distribution.comparison.Comparison`, a decision
a :class:`~certeval.estimators.results.Decision`, a sub-dataset's interval a
:class:`~certeval.estimators.results.SubsetEstimate`, a selected model a
:class:`~certeval.estimators.distribution.selection.ModelStatus`, and a model's live estimate
(:class:`EstimateResult`) has the fields of :class:`~certeval.estimators.results.Estimate`. The record is turned into
JSON by its one :meth:`RunResults.to_json` and read back by :func:`read_record` (any stored results.json: a JSON
object of a version and ``kind`` this certeval knows, upgraded to :data:`SCHEMA_VERSION`, every part typed). The
constructor takes the nested parts as their types or as the JSON objects they are written as, and checks both.

A float is ``NaN`` where nothing was measured and is written as ``null``; a field the record does not hold for its
kind is :data:`ABSENT` and left out of the JSON. lm-eval's own shapes (``results``, ``lm_eval``, a model's
``results``) are typed as lm-eval writes them: ``<metric>,<filter>`` keys to numbers or strings.

What changes the version: removing or renaming a key, or changing what one means; :func:`upgrade` reads every
earlier version (0: written before ``schema_version`` existed; 1: a model entry of a rank or select run repeated its
interval as ``ranking_*`` / ``selection_lower``/``selection_upper``, and a pair's ``done`` its verdict). Adding an
optional key keeps the version.

:func:`json_schema` builds the JSON Schema from these types; the package ships it (:data:`SCHEMA_FILE`, package
data, so an installed wheel validates) and docs/results.schema.json is the same file. :func:`validate` checks a
record against it (it needs ``jsonschema``): the test suite wraps every ``to_json`` with it (tests/conftest.py),
so a test whose run writes a results.json the schema refuses fails there; a user's run never pays for it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import numbers
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from certeval.errors import InputError
from certeval.estimators.distribution.comparison import Comparison
from certeval.estimators.distribution.selection import ModelStatus
from certeval.estimators.results import Decision, Estimate, to_jsonable
from certeval.messages import shown

SCHEMA_VERSION = 2
RunKind = Literal["certify", "compare", "rank", "select"]
RUN_KINDS: tuple[str, ...] = get_args(RunKind)
# the fields only some kinds have (absent for the others)
KIND_FIELDS: dict[str, tuple[str, ...]] = {"compare": ("pairs",), "rank": ("ranking", "pairs"),
                                           "select": ("selection",)}
SCHEMA_FILE = Path(__file__).resolve().parents[1] / "data" / "results.schema.json"  # package data


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


def _optional(description: str = "", **schema: Any) -> Any:
    """A field the record holds only for some runs (left out of the JSON otherwise)."""
    return field(default=ABSENT, metadata={"description": description, **schema})


def _about(description: str = "", **schema: Any) -> Any:
    """A required field with a description (and JSON Schema keywords such as ``minimum``)."""
    return field(metadata={"description": description, **schema})


class _Part:
    """Every nested part: built from its JSON object (checked), written back as one."""

    def __post_init__(self) -> None:
        _check_fields(self, type(self).__name__)

    def to_json(self) -> dict[str, Any]:
        return _plain(self)


# ----------------------------------------------------------------------------------------------------------------
# the parts
# ----------------------------------------------------------------------------------------------------------------

TaskBlock = Mapping[str, float | str]  # lm-eval's "<metric>,<filter>": value (stderr "N/A" if unknown)


@dataclass(frozen=True)
class Aggregate(_Part):
    """What the run's numbers are a mean of (``--aggregate``)."""

    name: Literal["mean", "subset-mean"]
    subsets: int
    text: str


@dataclass(frozen=True)
class ScoreCache(_Part):
    """Where the score cache keeps a model's scores (docs/architecture.md, "Score cache key"): the key, what it
    covers (files: the model's files were read; address: a server or remote file, named by its spec), the
    fingerprint's digest, and why scores cached for the model's earlier files were not reused (null: nothing)."""

    key: str
    covers: Literal["files", "address"]
    fingerprint: str
    not_reused: str | None


def _as_written(result: type, name: str, doc: str, **written_as: Any) -> type:
    """The part an estimator's frozen result type ``result`` is stored as, as its ``to_dict`` writes it: each of its
    fields, required, with its type (one list of fields, the estimator's); ``written_as`` gives the type of a field
    the JSON holds otherwise (a tuple of pairs written as an object, a string of known values) and adds the
    properties ``to_dict`` writes after the fields."""
    hints = get_type_hints(result)
    names = [f.name for f in fields(result)]
    spec = [(n, written_as.get(n, hints[n])) for n in names] + [(n, tp) for n, tp in written_as.items()
                                                                if n not in names]
    part = dataclasses.make_dataclass(name, spec, bases=(_Part,), frozen=True)
    part.__module__, part.__qualname__, part.__doc__ = __name__, name, doc
    return part


EstimateResult = _as_written(
    Estimate, "EstimateResult",
    "The live estimator's result (:class:`certeval.estimators.results.Estimate`), equal to the look log's.",
    validity=Literal["exact", "asymptotic", "heuristic"], extra=Mapping[str, Any], halfwidth=float)


@dataclass(frozen=True)
class OtherMetric(_Part):
    """Another metric the task lists, read off the stored answers, with the run's method fed its scores on the
    same draws."""

    metric: str
    filter: str
    mean: float
    lower: float
    upper: float
    halfwidth: float
    stderr: float
    n_scored: int
    confidence: float
    method: str
    anytime_valid: bool
    guarantee: str
    interval: str


@dataclass(frozen=True)
class TaskMetric(_Part):
    """A mixed run's metric of one task: its interval where one is certified, else why not."""

    certified: bool
    why: str = _optional("why no interval")
    metric: str = _optional()
    filter: str = _optional()
    task: str = _optional()
    n_scored: int = _optional()
    mean: float | None = _optional()
    lower: float = _optional()
    upper: float = _optional()
    confidence: float = _optional()
    method: str = _optional()
    anytime_valid: bool = _optional()
    interval: str = _optional()


@dataclass(frozen=True)
class ModelResult(_Part):
    """One model: its numbers are the look log's last entry (certeval/record/looks.py)."""

    model: str
    spec: str
    mean: float
    lower: float
    upper: float
    halfwidth: float
    n_scored: int = _about(minimum=0)
    n_total: int = _about(minimum=0)
    confidence: float = _about(exclusiveMinimum=0, exclusiveMaximum=1)
    method: str = _about()
    guarantee: str = _about()
    anytime_valid: bool = _about()
    validity: Literal["exact", "asymptotic", "heuristic"] = _about()
    items_sent_to_model: int = _about(minimum=0)
    decision: Decision | None = _about()
    estimate: EstimateResult = _about()
    results: Mapping[str, TaskBlock] = _about("lm-eval's results block of the model's task")
    score_cache: ScoreCache = _optional("where the score cache keeps this model's scores")
    history: Mapping[str, Any] = _optional("the history prior the model's method learnt from (sources, models)")
    metric: str = _optional("the <metric>,<filter> the run stopped on")
    metrics: Mapping[str, OtherMetric] = _optional("the task's other metrics, each with its interval")
    metrics_not_reported: Mapping[str, str] = _optional("other metrics of the task that could not be given, and why")
    metrics_uncertified: Mapping[str, Mapping[str, Any]] = _optional("lm-eval's corpus metrics: values, no interval")
    task_metrics: Mapping[str, Mapping[str, TaskMetric]] = _optional("a mixed run: every metric of each task")
    selection_status: str = _optional("select: the model's status in the selection")


@dataclass(frozen=True)
class RankingResult(_Part):
    """A ranking: the models best first and its listing as tie groups (no order claimed within a group); the
    statement it makes (``strict`` verdicts at the margin, ``epsilon``-statements, or ``precision``)."""

    models: tuple[str, ...]
    tie_groups: tuple[tuple[str, ...], ...] = _about("the listing: tie groups, best first")
    means: tuple[float, ...] = _about("each model's mean over the items it was scored on, in models' order")
    items_used: tuple[int, ...] = _about()
    n_total: int = _about()
    fraction_used: float = _about()
    alpha: float = _about()
    correction: str = _about()
    guarantee: str = _about()
    statement: Literal["strict", "epsilon", "precision"] = _about()
    epsilon: float | None = _about("epsilon-statements: a higher group's mean is at least a lower's minus epsilon")
    halfwidth: float | None = _about("precision: every model's interval within ±halfwidth")
    n_pairs: int = _about()
    n_pairs_decided: int = _about()


@dataclass(frozen=True)
class SelectionResult(_Part):
    """The selected models (best first), the discarded ones, and every model's final interval."""

    selected: tuple[str, ...]
    discarded: tuple[str, ...]
    models: tuple[ModelStatus, ...]
    n_total: int
    fraction_used: float
    threshold: float | None
    halfwidth: float | None
    mode: str
    alpha: float
    guarantee: str
    validity: str = _optional("of the per-model intervals")
    top: int = _optional("best-arm selection: how many models")
    epsilon: float = _optional("best-arm selection: an epsilon-top-K")
    target: str = _optional()
    done: bool = _optional()


@dataclass(frozen=True)
class HistoryUse(_Part):
    """The ``--history`` sources the run learnt from."""

    sources: tuple[str, ...]
    comparison_target: str | None
    rule: str


@dataclass(frozen=True)
class Settings(_Part):
    """The settings that state the question (the rest is in config.json)."""

    goal: str | None
    method: str | None
    batch_size: int | None
    max_items: int | None
    margin: float | None
    threshold: float | None
    halfwidth: float | None
    mode: str | None
    target: str | None
    top: int | None
    epsilon: float | None


@dataclass(frozen=True)
class Phases(_Part):
    """Where the command's time went, in seconds (docs/pipeline.md, "Phases")."""

    startup_s: float | None = _about(minimum=0)
    model_load_s: float | None = _about(minimum=0)
    rounds_s: float = _about(minimum=0)
    controller_s: float = _about(minimum=0)
    storage_s: float = _about(minimum=0)
    report_s: float | None = _about(minimum=0)


@dataclass(frozen=True)
class Pipeline(_Part):
    """What the run cost and where it ran: items sent per model, batches, actors, placement, time."""

    resumed: bool
    items_sent: Mapping[str, int]
    ray_address: str | None
    wall_s: float
    batches: int = _optional()
    batches_resubmitted: int = _optional()
    actors_replaced: int = _optional()
    placement: tuple[Mapping[str, Any], ...] = _optional("which Ray node each model actor ran on")
    shared_actors: Mapping[str, Any] = _optional("models that shared an actor (too few CPUs for one each)")
    ahead: Mapping[str, Any] | None = _optional("proposing ahead's account (null: the run did not)")
    phases: Phases = _optional()


@dataclass(frozen=True)
class Rescore(_Part):
    """Where a rescored run's outputs came from and how they were judged again."""

    source_run: str
    source_scorer: str | None
    scorer: str
    model_calls: int
    stopped_at_record_end: Mapping[str, int]
    rule: str


@dataclass(frozen=True)
class RunResults(_Part):
    """results.json of a ``certify``/``compare``/``rank``/``select`` run (and of a rescore of one).

    Every model's numbers are its look log's last entry (:mod:`certeval.record.looks`). The fields after ``pipeline`` are
    present only for the kinds that have them (:data:`KIND_FIELDS`; ``ABSENT`` otherwise); a rescore adds
    ``scorer`` and ``rescore``.
    """

    run_id: str = _about(minLength=1)
    kind: RunKind = _about()
    task: str = _about()
    bank: str | None = _about()
    target: Literal["bank", "distribution", "mixed"] = _about()
    confidence: float = _about(exclusiveMinimum=0, exclusiveMaximum=1)
    seed: int | None = _about()
    rounds: int = _about(minimum=0)
    done: bool = _about()
    reached: bool = _about()
    aggregate: Aggregate = _about()
    models: tuple[ModelResult, ...] = _about(minItems=1)
    results: Mapping[str, TaskBlock] = _about("lm-eval's per-task results block(s)")
    lm_eval: Mapping[str, Mapping[str, Any]] = _about("one lm-eval results file per model")
    history: HistoryUse | None = _about()
    config: Settings = _about()
    run_folder: str = _about()
    pipeline: Pipeline = _about()
    ranking: RankingResult = _optional("rank: the ranking and its listing")
    pairs: tuple[Comparison, ...] | None = _optional("compare: the pair; rank: every pair (null when in pairs_file)")
    pairs_file: str = _optional("rank with more than 5000 pairs: a Parquet table of them")
    selection: SelectionResult = _optional("select: the selection")
    scorer: str = _optional("rescore: the scorer that judged the outputs again")
    rescore: Rescore = _optional("rescore: where the outputs came from")
    schema_version: Literal[2] = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _check_fields(self, "results.json")
        for name in KIND_FIELDS.get(self.kind, ()):
            if getattr(self, name) is ABSENT:
                raise InputError(f"results.json of a {self.kind} run has no {name!r} field")
        if self.rescore is not ABSENT and self.scorer is ABSENT:
            raise InputError("results.json of a rescore has no 'scorer' field")

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored as results.json: ``schema_version`` first, then the fields in order, absent
        ones left out."""
        out = _plain(self)
        return {"schema_version": out.pop("schema_version"), **out}

    @classmethod
    def from_json(cls, obj: Any, where: str = "results.json") -> RunResults:
        """The record of a stored results.json: :func:`read_record`."""
        return read_record(obj, where)

    def replace(self, **changes: Any) -> RunResults:
        return dataclasses.replace(self, **changes)

    def model(self, name: str) -> ModelResult | None:
        """The entry of model ``name`` (None when the run has no such model)."""
        return next((m for m in self.models if m.model == name), None)


# ----------------------------------------------------------------------------------------------------------------
# building the parts from JSON, and back
# ----------------------------------------------------------------------------------------------------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _check_fields(part: Any, where: str) -> None:
    """Each field of ``part`` as its type: a nested part given as its JSON object is built (frozen: set once)."""
    hints = _hints(type(part))
    for f in fields(part):
        value = getattr(part, f.name)
        if value is ABSENT:
            continue
        _check_length(f, value, where)
        object.__setattr__(part, f.name, _as(hints[f.name], value, where, f.name))


def _check_length(f: dataclasses.Field, value: Any, where: str) -> None:
    if f.metadata.get("minItems") and isinstance(value, (list, tuple)) and len(value) < f.metadata["minItems"]:
        raise InputError(f"{where} lists no {f.name} (field {f.name!r} is empty): it is not a record certeval writes")


def _is_part(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _at(where: str, path: str) -> str:
    return f"{where}: {path}" if path else where


def _as(tp: Any, value: Any, where: str, path: str = "") -> Any:
    """``value`` as type ``tp`` (parts built from their JSON objects, sequences as tuples); an InputError naming
    ``where`` and the field's ``path`` when it is not one."""
    if tp is float and type(value) is float or tp is str and type(value) is str or tp is int and type(value) is int:
        return value  # the common case, without the checks below
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _as(option, value, where, path)
            except InputError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is Literal:
        if value not in args or isinstance(value, bool) != isinstance(args[0], bool):
            raise InputError(f"{_at(where, path)} is not one of {', '.join(map(repr, args))}: {shown(value)}")
        return value
    if _is_part(tp):
        if type(value) is tp:
            return value
        if not isinstance(value, Mapping):
            raise InputError(f"{_at(where, path)} is not a JSON object: {shown(value)}")
        named = {f.name: f for f in fields(tp)}
        unknown = sorted(set(value) - set(named))
        if unknown:
            raise InputError(f"{_at(where, path)} has unknown field {shown(unknown[0])}; it was not written by this "
                             "version of certeval")
        missing = [n for n, f in named.items() if n not in value and f.default is not ABSENT]  # as the schema
        if missing:
            raise InputError(f"{_at(where, path)} has no {missing[0]!r} field")
        for f in named.values():
            _check_length(f, value.get(f.name), where)
        hints = _hints(tp)
        return tp(**{k: _as(hints[k], v, where, f"{path}.{k}" if path else k) for k, v in value.items()})
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise InputError(f"{_at(where, path)} is not a list: {shown(value)}")
        return tuple(_as(args[0], v, where, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, Mapping):
            raise InputError(f"{_at(where, path)} is not a JSON object: {shown(value)}")
        return {str(k): _as(args[1], v, where, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, (bool, _np_bool())):
            raise InputError(f"{_at(where, path)} is not true or false: {shown(value)}")
        return value
    if tp is int:
        if isinstance(value, (bool, _np_bool())) or not isinstance(value, numbers.Integral):
            raise InputError(f"{_at(where, path)} is not an integer: {shown(value)}")
        return value
    if tp is float:  # NaN is written as null: a float field reads null as "not measured"
        if value is not None and (isinstance(value, (bool, _np_bool())) or not isinstance(value, numbers.Real)):
            raise InputError(f"{_at(where, path)} is not a number: {shown(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise InputError(f"{_at(where, path)} is not a string: {shown(value)}")
        return value
    raise TypeError(f"results_record: no reader for type {tp!r} ({path})")  # a type added without one: a bug


def _np_bool() -> type:
    import numpy as np

    return np.bool_


def _plain(value: Any) -> Any:
    """A part as the JSON object it is written as: absent fields left out, numpy values as Python's, NaN kept (the
    writer turns it into null)."""
    if _is_part(type(value)):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value) if getattr(value, f.name) is not ABSENT}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return to_jsonable(value, strict=False)


# ----------------------------------------------------------------------------------------------------------------
# reading a stored record
# ----------------------------------------------------------------------------------------------------------------


def upgrade(obj: dict[str, Any]) -> dict[str, Any]:
    """A stored record of an earlier version as this version writes it: version 0 (written before
    ``schema_version`` existed) and 1 repeated each model's interval as ``ranking_mean``/``ranking_lower``/
    ``ranking_upper``/``ranking_items`` (rank) and ``selection_lower``/``selection_upper`` (select), the model's
    own ``mean``/``lower``/``upper``/``n_scored``, and each pair's ``done`` (its verdict is not ``undecided``):
    dropped here."""
    version = obj.get("schema_version", 0)
    if version >= SCHEMA_VERSION:
        return obj
    repeated = ("ranking_mean", "ranking_lower", "ranking_upper", "ranking_items", "selection_lower", "selection_upper")
    models, pairs = obj.get("models"), obj.get("pairs")
    if isinstance(models, list):
        models = [{k: v for k, v in m.items() if k not in repeated} if isinstance(m, dict) else m for m in models]
    if isinstance(pairs, list):  # a pair's "done" repeated that its verdict is not "undecided"
        pairs = [{k: v for k, v in p.items() if k != "done"} if isinstance(p, dict) else p for p in pairs]
    return {"schema_version": SCHEMA_VERSION, **{k: v for k, v in obj.items() if k != "schema_version"},
            **({"models": models} if "models" in obj else {}), **({"pairs": pairs} if "pairs" in obj else {})}


def read_record(obj: Any, where: str = "results.json") -> RunResults:
    """A stored results.json as the typed record: a JSON object whose ``schema_version`` (0 when absent) is not
    newer than :data:`SCHEMA_VERSION`, whose ``kind`` this version knows, upgraded (:func:`upgrade`) and built part
    by part; an :class:`InputError` naming ``where`` (one line) otherwise."""
    if not isinstance(obj, dict):
        raise InputError(f"{where} is not a JSON object")
    version = obj.get("schema_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InputError(f"{where} has an invalid schema_version {shown(version)}")
    if version > SCHEMA_VERSION:
        raise InputError(f"{where} has schema_version {version}, newer than this certeval reads "
                         f"({SCHEMA_VERSION}): upgrade certeval to read it")
    kind = obj.get("kind")
    if kind not in RUN_KINDS:
        raise InputError(f"{where} has kind {shown(kind)}, which this certeval does not know (kinds: "
                         f"{', '.join(RUN_KINDS)})")
    return _as(RunResults, upgrade(obj), where)


# ----------------------------------------------------------------------------------------------------------------
# the JSON Schema, built from the types
# ----------------------------------------------------------------------------------------------------------------


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of results.json, built from :class:`RunResults` and its parts: one ``$defs``
    entry per part, every field's type, which fields are required, and the fields each kind needs."""
    defs: dict[str, Any] = {}
    _schema_of(RunResults, defs)
    top = defs.pop("RunResults")
    top["allOf"] = [{"if": {"properties": {"kind": {"const": kind}}}, "then": {"required": list(names)}}
                    for kind, names in KIND_FIELDS.items()]
    top["allOf"].append({"if": {"required": ["rescore"]}, "then": {"required": ["scorer"]}})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://certeval.invalid/results.schema.json",
            "title": "certeval results.json",
            "description": f"results.json of a certeval run, schema_version {SCHEMA_VERSION}; generated from "
                           "certeval.record.results (json_schema()): do not edit by hand. A float is null where "
                           "nothing was measured (NaN).",
            **top, "$defs": dict(sorted(defs.items()))}


def _schema_of(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return {}
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        inner = _schema_of(options[0], defs) if len(options) == 1 else {"anyOf": [_schema_of(a, defs)
                                                                                  for a in options]}
        if type(None) not in args:
            return inner
        if set(inner) == {"type"}:
            kinds = inner["type"] if isinstance(inner["type"], list) else [inner["type"]]
            return {"type": [*dict.fromkeys([*kinds, "null"])]}
        if "enum" in inner:
            return {"enum": [*inner["enum"], None]}
        return {"anyOf": [inner, {"type": "null"}]}
    if origin is Literal:
        return {"const": args[0]} if len(args) == 1 else {"enum": list(args)}
    if _is_part(tp):
        name = tp.__name__
        if name not in defs:
            defs[name] = {}  # a placeholder while its fields are built
            hints = _hints(tp)
            props = {}
            for f in fields(tp):
                extra = {k: v for k, v in f.metadata.items() if v != ""}
                props[f.name] = {**_schema_of(hints[f.name], defs), **extra}
            defs[name] = {"type": "object", "description": " ".join((tp.__doc__ or "").split()),
                          "required": [f.name for f in fields(tp) if f.default is not ABSENT],
                          "additionalProperties": False, "properties": props}
        return {"$ref": f"#/$defs/{name}"}
    if origin is tuple:
        return {"type": "array", "items": _schema_of(args[0], defs)}
    if origin is Mapping:
        values = _schema_of(args[1], defs)
        return {"type": "object", **({"additionalProperties": values} if values else {})}
    if tp is float:
        return {"type": ["number", "null"]}  # NaN (nothing measured) is written as null
    return {"type": {bool: "boolean", int: "integer", str: "string"}[tp]}


def load_schema(path: str | Path = SCHEMA_FILE) -> dict[str, Any]:
    """The JSON Schema of results.json as shipped with the package (:data:`SCHEMA_FILE`)."""
    return json.loads(Path(path).read_text())


def schema_text() -> str:
    """:func:`json_schema` as the file it is shipped as (certeval/data/results.schema.json, docs/results.schema.json)."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def validate(obj: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> None:
    """Check a results.json object (as written: numpy values as Python ones, NaN as null) against the schema;
    raise :class:`ResultsSchemaError` with the first violation's path. Needs ``jsonschema``."""
    import jsonschema

    from certeval.storage.io import dumps  # the one JSON encoder results.json is written with

    plain = json.loads(dumps(obj))
    validator = _shipped_validator() if schema is None else jsonschema.Draft202012Validator(dict(schema))
    error = jsonschema.exceptions.best_match(validator.iter_errors(plain))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ResultsSchemaError(f"results.json does not match {SCHEMA_FILE.name} at {where}: {error.message}")


@functools.cache
def _shipped_validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(load_schema())


if __name__ == "__main__":  # python -m certeval.record.results > certeval/data/results.schema.json
    print(schema_text(), end="")


__all__ = ["ABSENT", "KIND_FIELDS", "RUN_KINDS", "SCHEMA_FILE", "SCHEMA_VERSION", "Aggregate",
           "EstimateResult", "HistoryUse", "ModelResult", "OtherMetric", "Phases", "Pipeline",
           "RankingResult", "Rescore", "ResultsSchemaError", "RunResults", "ScoreCache", "SelectionResult",
           "Settings", "TaskBlock", "TaskMetric", "json_schema", "load_schema", "read_record",
           "schema_text", "upgrade", "validate"]
