"""results.json is a typed, versioned record (certeval.results_record) and matches docs/results.schema.json.

Every results.json the suite writes in a test process is checked as it is written: ``tests/conftest.py`` wraps
``RunResults.to_json`` / ``BacktestResults.to_json`` with :func:`validate`, so a test whose run wrote a
results.json the schema refuses fails there; the stored runs below (CLI runs of each kind) are validated here. The tests below check that mechanism, the schema itself, the
record's round trip and its reader, and the stored results of a run of each kind and of a backtest.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from certeval.estimators._validation import InputError
from certeval.results_record import (
    ABSENT,
    SCHEMA_FILE,
    SCHEMA_VERSION,
    BacktestResults,
    ResultsSchemaError,
    RunResults,
    load_schema,
    read_results,
    validate,
)

from test_pipeline_support import MIDDLE, STRONG, WEAK, replay, small_scores


def _record(**changes) -> RunResults:
    model = {"model": "a", "spec": "replay:x#a", "mean": 0.5, "lower": 0.4, "upper": float("nan"), "halfwidth": 0.1,
             "n_scored": 10, "n_total": 20, "confidence": 0.95, "method": "uniform", "guarantee": "anytime",
             "anytime_valid": True, "validity": "exact", "items_sent_to_model": 10, "decision": None,
             "estimate": {}, "results": {}}
    fields = dict(run_id="r", kind="certify", task="t", bank=None, target="bank", confidence=0.95, seed=0, rounds=1,
                  done=True, reached=True, aggregate={"name": "mean", "subsets": 1, "text": "the mean"},
                  models=[model], results={}, lm_eval={}, history=None,
                  config={k: None for k in ("goal", "method", "batch_size", "max_items", "margin", "threshold",
                                            "halfwidth", "mode", "target", "top", "epsilon")},
                  run_folder="runs/r", pipeline={"resumed": False, "items_sent": {"a": 10}, "ray_address": "local",
                                                 "wall_s": 0.1})
    fields.update(changes)
    return RunResults(**fields)


def test_the_suite_checks_every_results_json_it_writes():
    assert hasattr(RunResults.to_json, "plain") and hasattr(BacktestResults.to_json, "plain")  # tests/conftest.py
    assert SCHEMA_FILE.is_file() and SCHEMA_FILE == Path(__file__).resolve().parents[1] / "docs" / SCHEMA_FILE.name


def test_the_schema_is_a_draft_2020_12_schema_of_this_version():
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$defs"]["run"]["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
    assert schema["$defs"]["backtest"]["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
    # the schema's top-level keys are exactly the record's fields
    from dataclasses import fields

    assert set(schema["$defs"]["run"]["properties"]) == {f.name for f in fields(RunResults)}


def test_record_writes_version_first_and_leaves_absent_fields_out():
    out = _record().to_json()
    assert list(out)[0] == "schema_version" and out["schema_version"] == SCHEMA_VERSION
    assert "pairs" not in out and "ranking" not in out and "rescore" not in out
    validate(out)  # NaN is written as null, which the schema allows
    ranked = _record(kind="rank", ranking={"models": ["a"]}, pairs=None, pairs_file="runs/r/pairs.parquet").to_json()
    assert ranked["pairs"] is None  # None is a value (the pairs are in a file), not an absent field
    validate(ranked)


def test_record_round_trips_and_reads_files_from_before_the_version():
    out = _record(kind="select", selection={"selected": ["a"]}).to_json()
    assert RunResults.from_json(json.loads(json.dumps(out, default=str))).to_json().keys() == out.keys()
    legacy = {k: v for k, v in out.items() if k != "schema_version"}  # written before schema_version existed
    assert RunResults.from_json(legacy).schema_version == 0
    with pytest.raises(InputError, match="unknown field 'colour'"):
        RunResults.from_json({**out, "colour": "red"})
    with pytest.raises(InputError, match="no 'models' field"):
        RunResults.from_json({k: v for k, v in out.items() if k != "models"})
    with pytest.raises(InputError, match="newer than this certeval reads"):
        read_results({**out, "schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(InputError, match="not a JSON object"):
        read_results([out])
    assert _record().replace(scorer="exact").scorer == "exact" and _record().scorer is ABSENT


def test_the_check_refuses_a_record_the_schema_does_not_describe():
    with pytest.raises(ResultsSchemaError, match="models"):
        _record(models=[]).to_json()
    with pytest.raises(ResultsSchemaError, match="target"):
        _record(target="population").to_json()
    with pytest.raises(InputError, match="kind must be one of"):
        _record(kind="backtest")
    assert RunResults.to_json.plain(_record(models=[]))["models"] == []  # a user's run: nothing is checked


def test_backtest_record_matches_the_schema():
    out = BacktestResults(cells=[{"method": "uniform"}], n_reps_total=3).to_json()
    assert out == {"schema_version": SCHEMA_VERSION, "kind": "backtest", "cells": [{"method": "uniform"}],
                   "n_reps_total": 3}
    validate(out)


@pytest.mark.slow
def test_stored_results_of_every_kind_and_a_backtest_validate(infra, tmp_path):
    """A run of each kind and a stored backtest, through the real writers; each stored results.json validates
    against the schema file and reads back as the typed record. (A rescore's needs a model's stored outputs:
    tests/test_rescore.py writes them with SmolLM2, checked as they are written like every other.)"""
    from certeval.backtest.ray_fanout import backtest
    from certeval.flows.pipeline import run_plan
    from certeval.requests import request_for
    from certeval.tasks.plan import make_plan

    scores = small_scores(tmp_path, n_items=120)
    models = [replay(m, scores) for m in (STRONG, MIDDLE, WEAK)]
    cases = {"certify": dict(models=models[:1], goal="halfwidth:0.2"), "compare": dict(models=models[:2]),
             "rank": dict(models=models, margin=0.05), "select": dict(models=models, halfwidth=0.1)}
    schema = load_schema()
    stored = []
    for kind, kw in cases.items():
        plan, _ = make_plan(request_for(kind, output=str(tmp_path / "runs"), run_id=kind, seed=1, **kw))
        run_plan(plan)
        stored.append(tmp_path / "runs" / kind / "results.json")
    backtest(scores, "uniform", "halfwidth:0.2", 2, 0, use_ray=False, output=str(tmp_path / "backtest"),
             progress=None)
    stored.append(tmp_path / "backtest" / "results.json")
    for path in stored:
        doc = json.loads(path.read_text())
        validate(doc, schema)
        assert doc["schema_version"] == SCHEMA_VERSION
        if doc["kind"] != "backtest":
            assert RunResults.from_json(doc, str(path)).to_json() == doc
