"""``certeval backtest`` with history: fractions of the other models, sources, permuted history, the
uniform baseline on the same reps, and bad input."""

from __future__ import annotations

import json

import pytest

from certeval.backtests.single import SingleBacktestOptions, run_single_backtest
from certeval.cli import main
from certeval.estimators import parse_goal
from certeval.inputs.banks import bank_from_scores, load_scores

MODELS = ["openai_davinci", "openai_ada"]


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_history_fraction_backtest_beats_uniform_on_the_same_reps(capsys):
    # 8 reps a model: with 3, one model's draws can cost a batch more than uniform's and the mean ratio lands on 1
    out = _json(capsys, ["backtest", "--scores", "bundled:helm_mmlu", "--history-fraction", "0.5", "--goal",
                         "halfwidth:0.1", "--reps", "8", "--model", MODELS[0], "--model", MODELS[1], "--json"])
    assert out["method"] == "history"  # the default once history is given
    assert out["history"]["fraction"] == 0.5 and out["history"]["mean_models"] == 22  # round(0.5 × 43)
    # below 1: history still pays against uniform, which is itself tight now (one joint CS, tuned bets); how much
    # it pays on every bank is measured in benchmarks/exact_items.py, not here
    assert out["summary"]["coverage"] == 1.0 and out["summary"]["ratio_to_uniform"] < 1.0
    # the ratio's baseline is uniform replayed with the same per-rep seeds
    frame = load_scores("bundled:helm_mmlu")
    bank = bank_from_scores(frame)
    uni = run_single_backtest(frame, bank, MODELS, SingleBacktestOptions("uniform", parse_goal("halfwidth:0.1"), reps=8),
                              all_models=sorted(frame["model"].unique()))
    for mine, base in zip(out["models"], uni["models"]):
        assert mine["baseline_scored"] == pytest.approx(base["mean_scored"])


def test_history_sources_and_permuted_history(capsys):
    out = _json(capsys, ["backtest", "--scores", "bundled:helm_mmlu", "--history", "bundled:helm_mmlu",
                         "--goal", "halfwidth:0.1", "--reps", "2", "--model", MODELS[0], "--json"])
    assert out["history"]["mean_models"] == 43  # every other model; the evaluated one is left out
    perm = _json(capsys, ["backtest", "--scores", "bundled:helm_mmlu", "--history", "bundled:helm_mmlu",
                          "--history-permute", "--goal", "halfwidth:0.1", "--reps", "2", "--model", MODELS[0],
                          "--json"])
    assert perm["history"]["permuted"] is True and perm["summary"]["coverage"] == 1.0
    assert perm["models"][0]["mean_scored"] > out["models"][0]["mean_scored"]  # useless history helps less


@pytest.mark.parametrize("extra, message", [
    (["--history-fraction", "0"], "history-fraction"),
    (["--history-fraction", "0.5", "--history", "bundled:helm_mmlu"], "not both"),
    (["--history", "bundled:helm_mmlu", "--method", "adaptive"], "used by method 'history'"),
    (["--method", "history"], "needs history"),
    (["--history-permute", "--method", "uniform"], "--history-permute needs"),
])
def test_bad_history_backtests_exit_2(capsys, extra, message):
    argv = ["backtest", "--scores", "bundled:helm_mmlu", "--reps", "1", "--model", MODELS[0], *extra]
    if "--goal" not in extra:
        argv += ["--goal", "halfwidth:0.1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
