"""Progress off a terminal: one line per round of a run and one per model and rep of a backtest, on stderr,
each with the items scored, the current interval and the elapsed time; ``--quiet`` shows none. pytest's
captured stderr is not a terminal, so these runs take the plain-line path a log file or CI gets.

Real parts: the runs go through Prefect and the shared local Ray; the backtest replays recorded scores."""

from __future__ import annotations

import json
import re

import pytest

from certeval.cli import main

from test_pipeline_support import MIDDLE, WEAK, replay

pytestmark = pytest.mark.slow

ROUND = re.compile(r"^certeval: certify (?P<run>\S+) round (?P<round>\d+) \((?P<s>[\d.]+) s\): (?P<models>.+)$")
MODEL = re.compile(r"(?P<model>\S+) (?P<n>\d+) scored (?P<mean>[\d.]+) \[(?P<lower>[\d.]+), (?P<upper>[\d.]+)\]")
REP = re.compile(r"^certeval: backtest uniform halfwidth:0.1: (?P<model>\S+) rep (?P<rep>\d+): (?P<n>\d+) scored "
                 r"(?P<mean>[\d.]+) \[(?P<lower>[\d.]+), (?P<upper>[\d.]+)\] \((?P<s>[\d.]+) s\)$")


def test_a_run_off_a_terminal_prints_one_line_per_round_and_quiet_prints_none(infra, tmp_path, capsys):
    argv = ["certify", "--model", replay(MIDDLE), "--model", replay(WEAK), "--goal", "halfwidth:0.1",
            "--method", "uniform", "--batch-size", "40", "--output", str(tmp_path / "runs"), "--ray-address", infra,
            "--json"]
    code = main([*argv, "--run-id", "lines"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    res = json.loads(captured.out)  # standard output is the result alone
    rounds = [m for m in map(ROUND.match, captured.err.splitlines()) if m]
    assert [int(m["round"]) for m in rounds] == list(range(len(rounds))) and len(rounds) >= 2, captured.err
    assert [float(m["s"]) for m in rounds] == sorted(float(m["s"]) for m in rounds)  # time since the start
    last = {m["model"]: m for m in MODEL.finditer(rounds[-1]["models"])}
    assert set(last) == {MIDDLE, WEAK}
    for entry in res["models"]:  # the last line shows the interval the run ends with
        shown = last[entry["model"]]
        assert int(shown["n"]) == entry["n_scored"]
        for key in ("mean", "lower", "upper"):
            assert float(shown[key]) == pytest.approx(entry[key], abs=5e-4), (key, shown[0], entry)
    first = {m["model"]: int(m["n"]) for m in MODEL.finditer(rounds[0]["models"])}
    assert first == {MIDDLE: 40, WEAK: 40}  # one round: the batch of each model

    code = main([*argv, "--run-id", "quiet", "--quiet"])
    captured = capsys.readouterr()
    assert code == 0 and json.loads(captured.out)["models"]
    assert not [line for line in captured.err.splitlines() if line.startswith("certeval:")], captured.err


def test_a_backtest_off_a_terminal_prints_one_line_per_model_and_rep(capsys):
    argv = ["backtest", "--scores", "bundled:helm_mmlu", "--model", MIDDLE, "--model", WEAK, "--method", "uniform",
            "--goal", "halfwidth:0.1", "--reps", "3", "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    reps = [m for m in map(REP.match, captured.err.splitlines()) if m]
    assert sorted((m["model"], int(m["rep"])) for m in reps) == sorted((x, r) for x in (MIDDLE, WEAK) for r in range(3))
    for m in reps:
        assert float(m["lower"]) <= float(m["mean"]) <= float(m["upper"]) and int(m["n"]) > 0
    mean_items = {x: sum(int(m["n"]) for m in reps if m["model"] == x) / 3 for x in (MIDDLE, WEAK)}
    for entry in out["models"]:  # the lines are the reps the summary averages
        assert mean_items[entry["model"]] == pytest.approx(entry["mean_scored"]), entry
    assert main([*argv, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["models"] == out["models"]  # the same reps, whether shown or not
    assert not [line for line in captured.err.splitlines() if line.startswith("certeval:")], captured.err
