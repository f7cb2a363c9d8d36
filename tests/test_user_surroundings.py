"""Nothing a user's files, processes or neighbours do breaks certeval (issue 55): one table per class.

1. special and huge files: every file a user names or a run folder holds is opened one way
   (``certeval.storage.open_file``): a regular file within the size bound, never a pipe, socket, device or link loop;
   every echoed value cut to a readable length;
2. checks before start-up: every whole-number flag's range at parse time, numbers by target and the items a model host
   will need with the plan (and the paired statement started once on the bank), before Ray or Prefect start;
3. records read through their type: results.json and config.json of a run folder (report, rescore, ``--history RUN``)
   by kind, version, fields and parts; bank text a tokenizer cannot encode;
4. services own their files: the local Ray's token folder private (0700, this user's), a token others could read
   replaced, ``up`` exclusive and ``down`` idempotent;
5. any folder name is a model spec's location (``#``, ``?``, ``%`` escaped), checked through the CLI.

Each refusal runs in-process from an empty working folder and asserts exit 2, exactly one stderr line naming the flag
or file and echoing the value, nothing written (a listing of the working folder, the output folder and the fixtures
before and after: no ``.prefect``, no run folder) and no process left (this process's children before and after).
None starts Ray or Prefect, so the file costs seconds.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import stat
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from surface_table_support import assert_refused, children, listing, no_new_children, run_cli

from test_pipeline_support import MIDDLE, STRONG, WEAK, small_scores

HUGE = 3 << 30  # declared by sparse files: 3 GiB that take no disk space
# checkpoint folder names holding what a spec reserves, glob magic, shell syntax (class 5)
NAMES = ["run#3", "what?", "100%", "a%23b", "x&y", "sp ace", "ünï", "#?%", "[brackets]", "semi;colon", "quote'd",
         "key=value", "$(touch x)"]


def _sparse(path: Path, size: int = HUGE) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)
    return str(path)


def _run_record(kind: str = "rank", **over) -> dict:
    """A complete results.json of a run: a version-1 record certeval wrote (tests/data/results_v1/), with ``over``."""
    stored = Path(__file__).parent / "data" / "results_v1" / f"{'select' if kind == 'select' else 'rank'}.results.json"
    base = json.loads(stored.read_text())
    record = {**base, "kind": kind, **over}
    return {k: v for k, v in record.items() if v is not _DROP}


_DROP = object()
CONFIG = {"kind": "certify", "models": ["replay:s.parquet#m"], "labels": ["m"], "run_id": "r1"}


def _run_folder(root: Path, name: str, *, results=None, config=None, raw_results: bytes | None = None) -> str:
    folder = root / name
    (folder / "rounds").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CONFIG if config is None else config))
    if raw_results is not None:
        (folder / "results.json").write_bytes(raw_results)
    elif results is not None:
        (folder / "results.json").write_text(json.dumps(results))
    return str(folder)


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("surroundings")
    out = {"root": str(d), "scores": small_scores(d, n_items=30)}
    first_id = str(pd.read_parquet(out["scores"], columns=["item_id"])["item_id"].iloc[0])

    # class 1: special files
    special = d / "special"
    special.mkdir()
    os.mkfifo(special / "pipe.parquet")
    os.symlink(special / "pipe.parquet", special / "link-to-pipe.csv")
    os.symlink("/dev/zero", special / "zero.jsonl")  # a device behind a table's name
    out["socket"] = str(special / "sock.parquet")
    listener, here = socket.socket(socket.AF_UNIX), os.getcwd()
    try:  # bound by a relative name: a socket's path may not exceed 107 bytes, a deep temporary folder's may
        os.chdir(special)
        listener.bind("sock.parquet")
    finally:
        os.chdir(here)
        listener.close()  # the socket file stays
    os.symlink(special / "ring-b.parquet", special / "ring-a.parquet")
    os.symlink(special / "ring-a.parquet", special / "ring-b.parquet")
    _sparse(special / "huge.scores.parquet")
    _sparse(special / "huge-history.csv")
    os.symlink(special / "nowhere.parquet", special / "dangling.parquet")
    (special / "a-file").write_text("not a folder")
    run = Path(_run_folder(special, "pipe-config-run", results=_run_record()))
    (run / "config.json").unlink()
    os.mkfifo(run / "config.json")
    out["pipe_config_run"] = str(run)
    run = Path(_run_folder(special, "huge-results-run"))
    _sparse(run / "results.json", 300 << 20)  # over the 256 MiB a JSON record is read with
    out["huge_results_run"] = str(run)
    out["special"] = str(special)

    # class 2: banks a model host could not score
    banks = d / "banks"
    banks.mkdir()
    for name, rows in (
            ("no-choices", [{"item_id": "a", "question": "q", "choices": [], "answer": 0}]),
            ("letter-past", [{"item_id": "a", "question": "q", "choices": ["x", "y"], "answer": "E"}]),
            ("answer-elsewhere", [{"item_id": "a", "question": "q", "choices": ["x", "y"], "answer": "zz"}]),
            ("negative-gold", [{"item_id": "a", "question": "q", "choices": ["x", "y"], "answer": -1}])):
        pd.DataFrame(rows).to_json(banks / f"{name}.jsonl", orient="records", lines=True)
    out["banks"] = str(banks)

    # class 3: records read through their type; text no tokenizer encodes
    records = d / "records"
    records.mkdir()
    for name, results in (
            ("unknown-field", _run_record(extra_field=1)),
            ("kind-number", _run_record(kind=5)),
            ("no-models", _run_record(models=[])),
            ("version-text", _run_record(schema_version="1")),
            ("version-negative", _run_record(schema_version=-1)),
            ("no-run-id", _run_record(run_id=_DROP)),
            ("version-future", _run_record(schema_version=3)),
            ("kind-unknown", _run_record(kind="frobnicate")),
            ("kind-backtest", {"schema_version": 1, "kind": "backtest", "cells": [], "n_reps_total": 1})):
        out[f"rec_{name}"] = _run_folder(records, name, results=results)
    out["cfg_unknown"] = _run_folder(records, "cfg-unknown", results=_run_record(),
                                     config={**CONFIG, "hook": "pkg.mod:func"})
    out["cfg_models_text"] = _run_folder(records, "cfg-models-text", results=_run_record(),
                                         config={**CONFIG, "models": "replay:s.parquet#m"})
    out["cfg_labels"] = _run_folder(records, "cfg-labels", results=_run_record(), config={**CONFIG, "labels": []})
    out["cfg_backtest"] = _run_folder(records, "cfg-backtest", results=_run_record(),
                                      config={"kind": "backtest", "models": ["m"]})
    out["results_list"] = _run_folder(records, "results-list", raw_results=b"[1, 2]")
    for name, results in (("auto-unknown-field", _run_record(kind="select", picked="all")),
                          ("auto-no-models", _run_record(kind="select", models=[]))):
        specs = [f"replay:{out['scores']}#{STRONG}", f"replay:{out['scores']}#{WEAK}"]
        _run_folder(d / name, "yesterday", results=results,
                    config={"kind": "select", "models": specs, "labels": [STRONG, WEAK], "bank": None})
        out[name] = str(d / name)
    for name, row in (("surrogate-choice", {"choices": ["ok", "\udc80"]}),
                      ("surrogate-question", {"question": "caf\udc80 au lait"}),
                      ("surrogate-nested", {"meta": {"note": ["\udfff"]}})):
        item = {"item_id": first_id, "question": "q", "choices": ["a", "b"], "answer": 0, **row}
        path = records / f"{name}.jsonl"
        path.write_text(json.dumps(item) + "\n")  # JSON's \\udc80 escape: valid JSON, not valid Unicode text
        out[f"bank_{name}"] = str(path)

    # class 5: folders with what a spec reserves in their names
    ckpts = d / "ckpts"
    for name in NAMES:
        (ckpts / name).mkdir(parents=True)
        (ckpts / name / "config.json").write_text(json.dumps({"model_type": "llama"}))
    out["ckpts"] = str(ckpts)
    return out


def _r(fx, model: str = MIDDLE) -> str:
    return f"replay:{fx['scores']}#{model}"


def _certify(fx, *extra: str) -> list[str]:
    return ["certify", "--model", _r(fx), "--goal", "halfwidth:0.1", *extra]


def _pair(cmd: str, fx, *extra: str) -> list[str]:
    return [cmd, "--model", _r(fx, STRONG), "--model", _r(fx, WEAK), *extra]


def _hf(fx, bank: str) -> list[str]:
    return ["certify", "--model", "hf:bundled:smollm2", "--goal", "halfwidth:0.1", "--bank", bank]


def _refused(case_id, argv, fx, tmp_path, monkeypatch, capsys, *, flag, echo) -> str:
    """Run ``argv`` from an empty folder: exit 2, one line naming ``flag`` and echoing ``echo``, nothing written,
    no process left; the line."""
    monkeypatch.chdir(tmp_path)
    if argv[0] in ("certify", "compare", "rank", "select", "demo") and "--output" not in argv:
        argv = [*argv, "--output", str(tmp_path / "out")]
    watched = (tmp_path, Path(fx["root"]))
    before, procs = listing(*watched), children()
    code, lines, _ = run_cli(argv, capsys)
    assert_refused(case_id, code, lines, flag=flag, echo=echo)
    assert listing(*watched) == before, f"{case_id}: something was written"
    assert not no_new_children(procs), f"{case_id}: a process was left"
    return lines[0]


# ---------------------------------------------------------------------------------------------------------------
# 1. special and huge files: (case id, argv, what the line names, the value it echoes)
# ---------------------------------------------------------------------------------------------------------------

SPECIAL = [
    ("socket-as-scores", lambda fx: _certify(fx)[:2] + [f"replay:{fx['socket']}#m"] + _certify(fx)[3:],
     "scores file", "not a regular file"),
    ("device-behind-a-bank-name", lambda fx: _certify(fx, "--bank", fx["special"] + "/zero.jsonl"), "bank",
     "not a regular file"),
    ("link-to-a-pipe-as-history", lambda fx: _certify(fx, "--history", fx["special"] + "/link-to-pipe.csv"),
     "--history", "not a regular file"),
    ("pipe-as-backtest-scores", lambda fx: ["backtest", "--scores", fx["special"] + "/pipe.parquet"], "scores file",
     "pipe.parquet"),
    ("two-link-ring-as-bank", lambda fx: _certify(fx, "--bank", fx["special"] + "/ring-a.parquet"), "bank",
     "link loop"),
    ("two-link-ring-as-history", lambda fx: _certify(fx, "--history", fx["special"] + "/ring-b.parquet"), "--history",
     "link loop"),
    ("sparse-3-GiB-parquet-scores", lambda fx: ["backtest", "--scores", fx["special"] + "/huge.scores.parquet"],
     "scores file", "declares"),
    ("sparse-3-GiB-csv-history", lambda fx: _certify(fx, "--history", fx["special"] + "/huge-history.csv"),
     "--history", "declares"),
    ("max-file-size-below-a-real-file", lambda fx: ["backtest", "--scores", fx["scores"], "--max-file-size", "1K"],
     "scores file", "1024 bytes"),
    ("max-file-size-not-a-size", lambda fx: ["backtest", "--max-file-size", "lots", "--scores", fx["scores"]],
     "--max-file-size", "lots"),
    ("dangling-link-as-bank", lambda fx: _certify(fx, "--bank", fx["special"] + "/dangling.parquet"), "bank",
     "link to nothing"),
    ("table-below-a-file", lambda fx: _certify(fx, "--bank", fx["special"] + "/a-file/items.parquet"), "bank",
     "below a file"),
    ("run-folder-config-a-pipe", lambda fx: ["report", fx["pipe_config_run"]], "config.json", "not a regular file"),
    ("run-folder-results-sparse-300-MiB", lambda fx: ["report", fx["huge_results_run"]], "results.json", "declares"),
    ("history-run-config-a-pipe", lambda fx: _certify(fx, "--history", fx["pipe_config_run"]), "config.json",
     "not a regular file"),
    ("report-of-a-pipe", lambda fx: ["report", fx["special"] + "/pipe.parquet"], "run folder", "not a folder"),
    ("rescore-of-a-link-ring", lambda fx: ["rescore", fx["special"] + "/ring-a.parquet", "--scorer", "exact"],
     "rescore", "link loop"),
    ("a-100k-character-model-name", lambda fx: _certify(fx)[:2] + [_r(fx, "m" * 100_000)] + _certify(fx)[3:],
     "unknown model", "…["),
    ("a-line-break-in-a-model-name", lambda fx: _certify(fx)[:2] + [_r(fx, "two\nlines")] + _certify(fx)[3:],
     "unknown model", "two\\nlines"),
    ("a-100k-character-run-id", lambda fx: _certify(fx, "--run-id", "../" + "x" * 100_000), "run-id", "…["),
]


@pytest.mark.parametrize("case_id,build,flag,echo", SPECIAL, ids=[c[0] for c in SPECIAL])
def test_a_special_or_huge_file_is_refused_unread_in_one_short_line(case_id, build, flag, echo, fx, tmp_path,
                                                                    monkeypatch, capsys):
    line = _refused(case_id, build(fx), fx, tmp_path, monkeypatch, capsys, flag=flag, echo=echo)
    assert len(line) <= 2100, (case_id, len(line))  # every echoed value cut: never a 100 kB line


# ---------------------------------------------------------------------------------------------------------------
# 2. checks before start-up
# ---------------------------------------------------------------------------------------------------------------

BEFORE_START = [
    ("backtest-reps-over-the-bound", lambda fx: ["backtest", "--scores", fx["scores"], "--reps", "100001"],
     "--reps", "100001"),
    ("backtest-select-reps-a-million", lambda fx: ["backtest", "select", "--scores", fx["scores"], "--reps",
                                                   "1000000"], "--reps", "1000000"),
    ("certify-max-items-over-the-bound", lambda fx: _certify(fx, "--max-items", "100000001"), "--max-items",
     "100000001"),
    ("certify-limit-over-the-bound", lambda fx: _certify(fx, "--limit", "1000000000000"), "--limit",
     "1000000000000"),
    ("certify-replicas-257", lambda fx: _certify(fx, "--replicas", "257"), "--replicas", "257"),
    ("rank-in-flight-65", lambda fx: _pair("rank", fx, "--in-flight", "65"), "--in-flight", "65"),
    ("compare-num-cpus-5000", lambda fx: _pair("compare", fx, "--num-cpus", "5000"), "--num-cpus", "5000"),
    ("certify-seed-2-to-the-63", lambda fx: _certify(fx, "--seed", str(2**63)), "--seed", str(2**63)),
    ("backtest-compare-batch-size-ten-million", lambda fx: ["backtest", "compare", "--scores", fx["scores"],
                                                            "--batch-size", "10000000"], "--batch-size", "10000000"),
    ("backtest-compare-pairs-a-billion", lambda fx: ["backtest", "compare", "--scores", fx["scores"], "--pairs",
                                                     "1000000000"], "--pairs", "1000000000"),
    ("demo-lm-items-ten-million", lambda fx: ["demo", "--lm-items", "10000000"], "--lm-items", "10000000"),
    ("certify-actor-start-timeout-1e300", lambda fx: _certify(fx, "--actor-start-timeout", "1e300"),
     "--actor-start-timeout", "1e+300"),
    ("select-distribution-halfwidth-one", lambda fx: _pair("select", fx, "--target", "distribution", "--threshold",
                                                           "0.5", "--halfwidth", "1"), "--halfwidth", "1.0"),
    ("certify-num-gpus-a-thousand", lambda fx: _certify(fx, "--num-gpus", "1000"), "--num-gpus", "1000"),
    ("hf-bank-item-without-choices", lambda fx: _hf(fx, fx["banks"] + "/no-choices.jsonl"), "mc-loglik",
     "at least 2 choices"),
    ("hf-bank-answer-letter-past-the-choices", lambda fx: _hf(fx, fx["banks"] + "/letter-past.jsonl"), "mc-loglik",
     "outside its 2 choices"),
    ("hf-bank-answer-not-a-choice", lambda fx: _hf(fx, fx["banks"] + "/answer-elsewhere.jsonl"), "mc-loglik", "'zz'"),
    ("hf-bank-negative-gold", lambda fx: _hf(fx, fx["banks"] + "/negative-gold.jsonl"), "mc-loglik", "-1"),
]


@pytest.mark.parametrize("case_id,build,flag,echo", BEFORE_START, ids=[c[0] for c in BEFORE_START])
def test_a_value_no_run_could_use_is_refused_before_anything_starts(case_id, build, flag, echo, fx, tmp_path,
                                                                    monkeypatch, capsys):
    if case_id.startswith("hf-"):
        from test_pipeline_support import needs_small_lm

        needs_small_lm()
    _refused(case_id, build(fx), fx, tmp_path, monkeypatch, capsys, flag=flag, echo=echo)


def test_every_whole_number_flag_has_a_range():
    """A whole-number flag of any command without a bound would take 10**9 (a MemoryError or an endless wait)."""
    import argparse

    from certeval.cli import build_parser
    from certeval.cli.ranges import INT_RANGES

    exempt = {"--looks", "--bank-size", "--sides"}  # bounds and plan: checked by their estimators, no allocation
    unbounded = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, [*path, name])
            elif action.type is int and not set(action.option_strings) & (set(INT_RANGES) | exempt):
                unbounded.append((" ".join(path), action.option_strings))

    walk(build_parser(), [])
    assert not unbounded, unbounded


# ---------------------------------------------------------------------------------------------------------------
# 3. records read through their type
# ---------------------------------------------------------------------------------------------------------------

RECORDS = [
    ("report-unknown-top-level-field", lambda fx: ["report", fx["rec_unknown-field"]], "results.json",
     "extra_field"),
    ("report-kind-a-number", lambda fx: ["report", fx["rec_kind-number"]], "results.json", "kind 5"),
    ("report-models-empty", lambda fx: ["report", fx["rec_no-models"]], "results.json", "no models"),
    ("report-schema-version-text", lambda fx: ["report", fx["rec_version-text"]], "schema_version", "'1'"),
    ("report-schema-version-negative", lambda fx: ["report", fx["rec_version-negative"]], "schema_version", "-1"),
    ("report-kind-backtest", lambda fx: ["report", fx["rec_kind-backtest"]], "results.json", "'backtest'"),
    ("report-kind-unknown", lambda fx: ["report", fx["rec_kind-unknown"]], "results.json", "frobnicate"),
    ("report-schema-version-future", lambda fx: ["report", fx["rec_version-future"]], "results.json",
     "schema_version 3"),
    ("rescore-schema-version-future", lambda fx: ["rescore", fx["rec_version-future"], "--scorer", "exact"],
     "results.json", "schema_version 3"),
    ("rescore-results-missing-run-id", lambda fx: ["rescore", fx["rec_no-run-id"], "--scorer", "exact"],
     "results.json", "run_id"),
    ("rescore-results-kind-unknown", lambda fx: ["rescore", fx["rec_kind-unknown"], "--scorer", "exact"],
     "results.json", "frobnicate"),
    ("rescore-config-unknown-field", lambda fx: ["rescore", fx["cfg_unknown"], "--scorer", "exact"], "config.json",
     "hook"),
    ("rescore-config-models-as-text", lambda fx: ["rescore", fx["cfg_models_text"], "--scorer", "exact"],
     "config.json", "models"),
    ("rescore-config-labels-empty", lambda fx: ["rescore", fx["cfg_labels"], "--scorer", "exact"], "config.json",
     "labels"),
    ("history-run-kind-unknown", lambda fx: _certify(fx, "--history", fx["rec_kind-unknown"]), "--history",
     "frobnicate"),
    ("history-run-unknown-field", lambda fx: _certify(fx, "--history", fx["rec_unknown-field"]), "--history",
     "extra_field"),
    ("history-run-schema-version-future", lambda fx: _certify(fx, "--history", fx["rec_version-future"]),
     "--history", "schema_version 3"),
    ("history-run-config-of-a-backtest", lambda fx: _certify(fx, "--history", fx["cfg_backtest"]), "--history",
     "config.json"),
    ("select-history-auto-unknown-field", lambda fx: _pair("select", fx, "--history", "auto", "--output",
                                                           fx["auto-unknown-field"]), "--history", "picked"),
    ("select-history-auto-no-models", lambda fx: _pair("select", fx, "--history", "auto", "--output",
                                                       fx["auto-no-models"]), "--history", "no models"),
    ("backtest-history-results-a-list", lambda fx: ["backtest", "--scores", fx["scores"], "--history",
                                                    fx["results_list"]], "--history", "not a JSON object"),
    ("bank-lone-surrogate-in-a-choice", lambda fx: _certify(fx, "--bank", fx["bank_surrogate-choice"]), "choices",
     "not valid Unicode"),
    ("bank-lone-surrogate-in-a-question", lambda fx: _certify(fx, "--bank", fx["bank_surrogate-question"]),
     "question", "not valid Unicode"),
    ("bank-lone-surrogate-nested", lambda fx: _certify(fx, "--bank", fx["bank_surrogate-nested"]), "meta",
     "not valid Unicode"),
]


@pytest.mark.parametrize("case_id,build,flag,echo", RECORDS, ids=[c[0] for c in RECORDS])
def test_a_stored_record_is_read_through_its_type(case_id, build, flag, echo, fx, tmp_path, monkeypatch, capsys):
    _refused(case_id, build(fx), fx, tmp_path, monkeypatch, capsys, flag=flag, echo=echo)


def test_the_config_fields_a_reader_knows_are_the_ones_a_plan_writes():
    """read_run_config's list is RunPlan.config()'s keys: a field added to the plan without it would be refused."""
    from certeval.runs.plan import CONFIG_EXTRAS, RunPlan, read_run_config

    config = RunPlan(kind="certify", models=("replay:s.parquet#m",), labels=("m",), bank=None).config()
    assert set(CONFIG_EXTRAS) <= set(config)
    assert read_run_config(json.loads(json.dumps(config)), "config.json")["kind"] == "certify"


# ---------------------------------------------------------------------------------------------------------------
# 4. services own their files and processes
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture()
def own_tmp(tmp_path, monkeypatch) -> Path:
    """The temporary folder the local Ray's state folder is made in, for this test only."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def _state(root: Path) -> Path:
    return root / f"certeval-ray-{os.getuid()}"


def _foreign_owner(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a folder to another user here")
    os.lchown(path, 65534, 65534)


STATE_REFUSALS = [
    ("state-folder-a-link", lambda p: os.symlink(p.parent, p), "a link"),
    ("state-folder-a-file", lambda p: p.write_text("x"), "not a folder"),
    ("state-folder-a-pipe", lambda p: os.mkfifo(p), "not a folder"),
    ("state-folder-another-users", lambda p: (p.mkdir(mode=0o700), _foreign_owner(p)), "belongs to uid"),
    ("state-folder-another-users-world-writable", lambda p: (p.mkdir(), p.chmod(0o777), _foreign_owner(p)),
     "belongs to uid"),
]


@pytest.mark.parametrize("case_id,plant,echo", STATE_REFUSALS, ids=[c[0] for c in STATE_REFUSALS])
def test_a_ray_state_folder_a_neighbour_planted_stops_a_run_before_it_starts(case_id, plant, echo, fx, own_tmp,
                                                                             tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    state = _state(own_tmp)
    plant(state)
    before = os.lstat(state)
    work = tmp_path / "work"
    work.mkdir()
    line = _refused(case_id, _certify(fx), fx, work, monkeypatch, capsys, flag=str(state), echo=echo)
    after = os.lstat(state)
    assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid), case_id  # left as it was
    assert "token" in line


def _pin(ray_home: Path, monkeypatch) -> str:
    from certeval.hosting.ray_setup import _pin_auth_token

    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    _pin_auth_token(ray_home, ray_home.parent / "home", local=True)
    return os.environ["RAY_AUTH_TOKEN_PATH"]


def _token_world_readable(token: Path) -> None:
    token.write_text("old-secret")
    token.chmod(0o644)


def _token_a_link(token: Path) -> None:
    target = token.parent.parent / "elsewhere"
    target.write_text("old-secret")
    os.symlink(target, token)


def _token_another_users(token: Path) -> None:
    token.write_text("old-secret")
    token.chmod(0o600)
    _foreign_owner(token)


TOKENS = [
    ("token-world-readable", _token_world_readable),
    ("token-a-link-to-another-file", _token_a_link),
    ("token-another-users", _token_another_users),
    ("token-group-writable", lambda t: (t.write_text("old-secret"), t.chmod(0o620))),
]


@pytest.mark.parametrize("case_id,plant", TOKENS, ids=[c[0] for c in TOKENS])
def test_a_token_others_could_read_or_plant_is_never_reused(case_id, plant, tmp_path, monkeypatch):
    ray_home = tmp_path / "ray-home"
    (ray_home / ".ray").mkdir(parents=True, mode=0o700)
    token = ray_home / ".ray" / "auth_token"
    plant(token)
    path = Path(_pin(ray_home, monkeypatch))
    st = os.lstat(path)
    assert path == token and stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid(), case_id
    assert stat.S_IMODE(st.st_mode) == 0o600 and path.read_text() != "old-secret", case_id
    elsewhere = tmp_path / "elsewhere"
    assert not elsewhere.exists() or elsewhere.read_text() == "old-secret"  # a link's target is never written


def test_the_state_folder_is_made_private_and_a_loose_one_of_ours_tightened(own_tmp, tmp_path, monkeypatch):
    from certeval.runtime.envsetup import private_folder, ray_bootstrap_home, ray_state_folder

    assert ray_state_folder() == _state(own_tmp)
    home = ray_bootstrap_home(ray_state_folder())
    assert stat.S_IMODE(os.stat(_state(own_tmp)).st_mode) == 0o700 and stat.S_IMODE(os.stat(home).st_mode) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o755)
    private_folder(loose, create=False)
    assert stat.S_IMODE(os.stat(loose).st_mode) == 0o700
    token = _pin(home, monkeypatch)
    assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
    assert _pin(home, monkeypatch) == token and Path(token).read_text()  # a private token of ours is reused


SERVICES = [
    ("down-with-nothing-up", [["down"]], 0, "nothing"),
    ("down-twice", [["down"], ["down"]], 0, "nothing"),
    ("up-num-cpus-zero", [["up", "--num-cpus", "0"]], 2, "--num-cpus"),
    ("up-num-cpus-huge", [["up", "--num-cpus", "100000"]], 2, "--num-cpus"),
]


@pytest.mark.parametrize("case_id,commands,want,word", SERVICES, ids=[c[0] for c in SERVICES])
def test_up_and_down_without_services_change_nothing(case_id, commands, want, word, tmp_path, monkeypatch, capsys):
    """``down`` is idempotent (exit 0, one line saying nothing runs); a refused ``up`` creates nothing."""
    monkeypatch.chdir(tmp_path)
    before, procs = listing(tmp_path), children()
    for argv in commands:
        code, err, out = run_cli(argv, capsys)
        lines = err if want else [line for line in out.splitlines() if line.strip()]
        assert code == want and len(lines) == 1 and word in lines[0], (case_id, code, err, out)
    assert listing(tmp_path) == before, f"{case_id}: something was written"
    assert not no_new_children(procs), f"{case_id}: a process was left"


def test_up_holds_its_lock_for_the_whole_start(tmp_path, monkeypatch, capsys):
    """``up`` is exclusive: the lock is held across the whole start (a second up or down waits its turn, bounded,
    and reads the record again under it). A real start is test_services.py's; here the start is a stand-in that
    waits inside the lock, so a mock, and says so."""
    import threading

    from certeval.cli import services as cli_services
    from certeval.errors import InputError
    from certeval.services import up_down as services

    monkeypatch.chdir(tmp_path)
    started, inside = [], threading.Event()
    release = threading.Event()

    def fake_start(cpus, cwd=None, timeout_s=180.0):
        started.append(cpus)
        inside.set()
        release.wait(10)
        raise InputError("stand-in start refused")  # a start that leaves no record

    monkeypatch.setattr(services, "start_services", fake_start)
    first = threading.Thread(target=lambda: _quiet(cli_services.run_up, 1))
    first.start()
    assert inside.wait(10)
    with pytest.raises(InputError, match="another certeval up/down holds"):
        with services.record_lock(services.services_file().parent, wait_s=0.5):
            pass
    release.set()
    first.join(10)
    assert started == [1]


def _quiet(run_up, cpus: int) -> None:
    import argparse

    try:
        run_up(argparse.Namespace(num_cpus=cpus))
    except Exception:  # the stand-in start's refusal
        pass


# ---------------------------------------------------------------------------------------------------------------
# 5. any folder name is a model spec's location
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_a_checkpoint_folder_of_any_name_passes_every_check_before_start(name, fx, tmp_path, monkeypatch, capsys):
    """``select --checkpoints`` on the folder and ``certify --model hf:<escaped>``: the folder's checks pass and the
    command stops only at the missing bank, the next check (so nothing starts); the spec names the folder itself."""
    from certeval.cli.surfaces import checkpoint_specs
    from certeval.inputs.model_spec import parse_model_spec, quote_location

    folder = os.path.join(fx["ckpts"], name)
    spec = parse_model_spec(checkpoint_specs([glob.escape(folder)])[0])
    assert (spec.kind, spec.location, spec.label) == ("hf", folder, name)
    missing = str(tmp_path / "none.jsonl")
    for argv in (["select", "--checkpoints", glob.escape(folder), "--model", _r(fx), "--bank", missing],
                 ["certify", "--model", f"hf:{quote_location(folder)}", "--goal", "halfwidth:0.1", "--bank",
                  missing]):
        _refused(name, argv, fx, tmp_path, monkeypatch, capsys, flag="bank", echo="none.jsonl")


def test_a_spec_s_location_escapes_round_trip_and_openai_urls_are_left_alone():
    from certeval.inputs.model_spec import parse_model_spec, quote_location

    for name in [*NAMES, "%25", "%3f", "plain/path"]:
        spec = parse_model_spec(f"hf:/ckpts/{quote_location(name)}#label?device=cpu")
        assert (spec.location, spec.name, spec.option("device")) == (f"/ckpts/{name}", "label", "cpu"), name
    assert parse_model_spec("openai:http://h/v1%23x#m").location == "http://h/v1%23x"
