"""results.json is a typed, versioned record (certeval.record.results) whose JSON Schema is generated from its types.

Every results.json the suite writes in a test process is checked as it is written: ``tests/conftest.py`` wraps
``RunResults.to_json`` with :func:`validate`, so a test whose run wrote a results.json the schema refuses fails
there. The tests below check that mechanism, that the schema shipped in the package and the one in docs/ are the one
generated from the types, the record's round trip, its reader (a version-1 record written by certeval before
version 2, stored in tests/data/, upgrades; a future version, an unknown kind, field or value is refused naming
it), and the stored results of a run of each kind. The command-line refusals (``report``, ``rescore``,
``--history``) are in tests/test_user_surroundings.py ("records read through their type").
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import fields
from pathlib import Path

import jsonschema
import pytest

from certeval.errors import InputError
from certeval.estimators.distribution.comparison import Comparison
from certeval.record.results import (
    ABSENT,
    SCHEMA_FILE,
    SCHEMA_VERSION,
    RankingResult,
    ResultsSchemaError,
    RunResults,
    json_schema,
    load_schema,
    read_record,
    schema_text,
    validate,
)

from test_pipeline_support import MIDDLE, STRONG, WEAK, replay, small_scores

ROOT = Path(__file__).resolve().parents[1]
# written by certeval at dc4e2e6 (schema_version 1): `certeval rank` (3 replay models, 40 HELM MMLU items, --margin 0.05)
# and `certeval select` (2 models, --halfwidth 0.2), seed 1, batch 20; their temporary folder cut from the paths
V1 = Path(__file__).resolve().parent / "data" / "results_v1"


def v1_record(kind: str) -> dict:
    """A version-1 results.json of a ``rank`` or ``select`` run, as certeval wrote it before version 2."""
    return json.loads((V1 / f"{kind}.results.json").read_text())


def _record(**changes) -> RunResults:
    """The version-1 rank record read as this version's, with ``changes``."""
    return read_record(v1_record("rank")).replace(**changes)


def test_the_suite_checks_every_results_json_it_writes():
    assert hasattr(RunResults.to_json, "plain")  # tests/conftest.py
    broken = _record(confidence=1.5)  # a type the record accepts, a value the schema does not
    with pytest.raises(ResultsSchemaError, match="confidence"):
        broken.to_json()  # caught as it is written
    assert RunResults.to_json.plain(broken)["confidence"] == 1.5  # what a user's run calls: nothing is checked
    with pytest.raises(InputError, match="target is not one of"):
        _record(target="population")  # a value outside its type: refused when the record is built


def test_the_schema_is_generated_from_the_types_and_shipped_in_the_package():
    generated = json_schema()
    jsonschema.Draft202012Validator.check_schema(generated)
    assert load_schema() == generated  # certeval/data/results.schema.json: package data
    assert (ROOT / "docs" / "results.schema.json").read_text() == schema_text() == SCHEMA_FILE.read_text()
    assert SCHEMA_FILE.parent == ROOT / "certeval" / "data"
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "data/*" in package_data["certeval"]  # so an installed wheel validates
    assert generated["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
    assert set(generated["properties"]) == {f.name for f in fields(RunResults)}
    # typed all the way down: the ranking's listing and every pair have their own definitions
    ranking = generated["$defs"]["RankingResult"]
    assert set(ranking["properties"]) == {f.name for f in fields(RankingResult)}
    assert ranking["properties"]["tie_groups"]["items"] == {"type": "array", "items": {"type": "string"}}
    assert ranking["properties"]["statement"] == {"enum": ["strict", "epsilon", "precision"]}
    assert set(generated["$defs"]["Comparison"]["required"]) == {f.name for f in fields(Comparison)}
    model = generated["$defs"]["ModelResult"]["properties"]
    assert not {"ranking_mean", "ranking_lower", "selection_lower", "selection_upper"} & set(model)
    assert all(d["additionalProperties"] is False for d in generated["$defs"].values())


def test_record_writes_version_first_and_leaves_absent_fields_out():
    record = _record()
    out = record.to_json()
    assert list(out)[0] == "schema_version" and out["schema_version"] == SCHEMA_VERSION
    assert "selection" not in out and "rescore" not in out and record.selection is ABSENT
    validate(out)
    in_file = record.replace(pairs=None, pairs_file="runs/r/pairs.parquet").to_json()
    assert in_file["pairs"] is None  # None is a value (the pairs are in a file), not an absent field
    validate(in_file)
    with pytest.raises(InputError, match="a rank run has no 'ranking'"):
        record.replace(ranking=ABSENT)


def test_record_round_trips_typed():
    record = _record()
    assert isinstance(record.ranking, RankingResult) and isinstance(record.pairs[0], Comparison)
    assert record.models[0].decision.rule and isinstance(record.models[0].estimate.subsets, tuple)
    again = read_record(json.loads(json.dumps(record.to_json())))
    assert again == record and again.to_json() == record.to_json()
    assert record.model(record.models[1].model) is record.models[1] and record.model("nobody") is None


def test_a_version_1_record_upgrades_without_the_repeated_intervals():
    for kind, repeated in (("rank", ("ranking_mean", "ranking_lower", "ranking_upper", "ranking_items")),
                           ("select", ("selection_lower", "selection_upper"))):
        old = v1_record(kind)
        assert old["schema_version"] == 1 and all(k in old["models"][0] for k in repeated)  # the fixture is v1
        record = read_record(old)
        assert record.schema_version == SCHEMA_VERSION and record.kind == kind
        out = record.to_json()
        validate(out)
        for new, was in zip(out["models"], old["models"]):
            assert not set(repeated) & set(new)
            assert {k: v for k, v in was.items() if k not in repeated} == new  # nothing else changed
        if kind == "rank":  # the dropped fields repeated the model's own numbers
            assert all(m["ranking_mean"] == m["mean"] and m["ranking_items"] == m["n_scored"] for m in old["models"])
        else:
            assert all(m["selection_lower"] == m["lower"] for m in old["models"])
            assert record.models[0].selection_status in {s.status for s in record.selection.models}
    legacy = {k: v for k, v in v1_record("rank").items() if k != "schema_version"}  # before the field existed
    assert read_record(legacy).schema_version == SCHEMA_VERSION


@pytest.mark.parametrize("change,message", [
    (lambda r: {**r, "schema_version": SCHEMA_VERSION + 1}, "schema_version 3, newer than this certeval reads"),
    (lambda r: {**r, "schema_version": "2"}, "invalid schema_version '2'"),
    (lambda r: {**r, "kind": "backtest"}, "kind 'backtest', which this certeval does not know"),
    (lambda r: {**r, "colour": "red"}, "unknown field 'colour'"),
    (lambda r: {k: v for k, v in r.items() if k != "models"}, "no 'models' field"),
    (lambda r: {**r, "models": []}, "lists no models"),
    (lambda r: {**r, "models": [{**r["models"][0], "mean": "high"}]}, "models\\[0\\].mean is not a number: 'high'"),
    (lambda r: {**r, "ranking": {**r["ranking"], "statement": "loose"}}, "ranking.statement is not one of"),
    (lambda r: {**r, "pairs": [{**r["pairs"][0], "extra": 1}]}, "pairs\\[0\\] has unknown field 'extra'"),
    (lambda r: {**r, "pipeline": {**r["pipeline"], "phases": {}}}, "pipeline.phases has no 'startup_s' field"),
], ids=["future-version", "version-text", "unknown-kind", "unknown-field", "no-models", "models-empty",
        "mean-text", "statement-unknown", "pair-unknown-field", "phases-empty"])
def test_the_reader_refuses_what_it_does_not_know_in_one_line(change, message):
    with pytest.raises(InputError, match=message) as caught:
        read_record(change(v1_record("rank")), "run folder 'r': results.json")
    assert str(caught.value).startswith("run folder 'r': results.json") and "\n" not in str(caught.value)
    with pytest.raises(InputError, match="not a JSON object"):
        read_record([v1_record("rank")])


def test_a_float_not_measured_is_written_as_null():
    record = _record()
    nan = record.replace(models=[record.models[0].to_json() | {"mean": math.nan}, *record.models[1:]])
    assert math.isnan(nan.models[0].mean)
    validate(nan.to_json())  # the writer's encoder turns NaN into null, which the schema allows
    assert read_record(json.loads(json.dumps(nan.to_json()).replace("NaN", "null"))).models[0].mean is None


@pytest.mark.slow
def test_stored_results_of_every_kind_validate(infra, tmp_path):
    """A run of each kind through the real writers; each stored results.json validates against the shipped schema
    and reads back as the typed record, equal to what was written. (A rescore's needs a model's stored outputs:
    tests/test_rescore.py writes them with SmolLM2, checked as they are written like every other.)"""
    from certeval.flows.pipeline import run_plan
    from certeval.requests import request_for
    from certeval.runs.plan import make_plan

    scores = small_scores(tmp_path, n_items=120)
    models = [replay(m, scores) for m in (STRONG, MIDDLE, WEAK)]
    cases = {"certify": dict(models=models[:1], goal="halfwidth:0.2"), "compare": dict(models=models[:2]),
             "rank": dict(models=models, epsilon=0.05), "select": dict(models=models, halfwidth=0.1)}
    schema = load_schema()
    for kind, kw in cases.items():
        plan, _ = make_plan(request_for(kind, output=str(tmp_path / "runs"), run_id=kind, seed=1, **kw))
        run_plan(plan)
        path = tmp_path / "runs" / kind / "results.json"
        doc = json.loads(path.read_text())
        validate(doc, schema)
        assert doc["schema_version"] == SCHEMA_VERSION and doc["kind"] == kind
        assert read_record(doc, str(path)).to_json() == doc
    rank = read_record(json.loads((tmp_path / "runs" / "rank" / "results.json").read_text()))
    assert rank.ranking.statement == "epsilon" and rank.ranking.epsilon == 0.05  # the rank --epsilon listing
