"""Comparative backtests on bundled real data, through the command line (``certeval backtest compare | rank |
select`` → :func:`certeval.api.backtest` → printed)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import numpy as np
import pandas as pd
import pytest

from certeval.cli import main


def _code(argv) -> int:
    """``certeval ARGV``'s exit status (argparse's refusals exit 2 from the parser)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def _json(capsys, *argv):
    assert main(["backtest", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def helm_rank():
    """One bank-target rank backtest on helm_mmlu (44 models, 2 reps, a look every 50 items) through the command
    line, shared by the checks below: the run is what costs, each check reads it. Returns the JSON it printed."""
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert main(["backtest", "rank", "--scores", "bundled:helm_mmlu", "--margin", "0.02", "--reps", "2",
                     "--batch-size", "50", "--json"]) == 0
    return json.loads(printed.getvalue())


@pytest.mark.slow
def test_rank_helm_mmlu_prints_tie_groups(helm_rank, capsys, monkeypatch):
    import certeval.api

    shared = certeval.api.BacktestResult.from_json(helm_rank)
    monkeypatch.setattr(certeval.api, "backtest", lambda *a, **k: shared)  # the shared run, as a table
    assert main(["backtest", "rank", "--scores", "bundled:helm_mmlu", "--margin", "0.02", "--reps", "2"]) == 0
    out = capsys.readouterr().out
    assert "tie groups" in out and "writer_palmyra-x" in out


@pytest.mark.slow
def test_rank_json_has_rankings_and_summary(helm_rank):
    out = helm_rank
    assert len(out["rankings"]) == 2 and len(out["rankings"][0]["models"]) == 44
    assert out["summary"]["family_wise_error_rate"] <= 0.5
    assert sum(len(g) for g in out["rankings"][0]["tie_groups"]) == 44


def test_compare_json_pairs(capsys):
    out = _json(capsys, "compare", "--scores", "bundled:vlm_ocrbench", "--pairs", "15", "--reps", "2",
                "--batch-size", "100")
    assert len(out["pairs"]) == 15 and out["config"]["pairs"] == 15
    s = out["summary"]
    assert 0 < s["fraction_used"] <= 1 and 0 <= s["separated"] <= 1
    assert s["directional_error_rate"] <= 0.05


def test_select_json(capsys):
    out = _json(capsys, "select", "--scores", "bundled:helm_raft", "--threshold", "0.6", "--halfwidth", "0.05",
                "--reps", "1", "--batch-size", "100")
    assert out["summary"]["wrong_discard_rate"] == 0.0 and out["runs"][0]["discarded"]


def test_pair_without_shared_items_is_input_error(tmp_path, capsys):
    frame = pd.DataFrame({"model": ["a", "a", "b", "b"], "item_id": ["1", "2", "3", "4"], "score": [1.0, 0, 1, 0]})
    path = tmp_path / "scores.parquet"
    frame.to_parquet(path)
    assert main(["backtest", "compare", "--scores", str(path), "--reps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "share no scored item" in err, err


@pytest.mark.parametrize("goal, new", [("compare:0", "certeval backtest compare --scores S --margin 0"),
                                       ("rank:0.02", "certeval backtest rank --scores S --margin 0.02"),
                                       ("select:0.6,0.05", "certeval backtest select --scores S --threshold 0.6 "
                                                           "--halfwidth 0.05")])
def test_the_older_goal_spellings_are_gone_in_one_line_naming_the_new_form(goal, new, capsys):
    code = _code(["backtest", "--scores", "bundled:helm_raft", "--goal", goal, "--reps", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"--goal {goal} is gone; use: {new}" in err, err


def test_unknown_model_is_input_error(capsys):
    assert _code(["backtest", "rank", "--scores", "bundled:helm_mmlu", "--model", "nope", "--model",
                  "writer_palmyra-x", "--reps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope" in err, err


@pytest.mark.parametrize("argv", [["rank", "--margin", "0.02"], ["compare"],
                                  ["select", "--threshold", "0.3", "--halfwidth", "0.05"]])
def test_distribution_target_still_answers_with_group_sequential_tests(argv, capsys):
    out = _json(capsys, *argv, "--scores", "bundled:helm_mmlu", "--target", "distribution", "--reps", "1",
                "--batch-size", "100")
    assert out["config"]["target"] == out["summary"]["target"] == "distribution"


@pytest.mark.slow
def test_bank_rank_backtest_states_are_exact_and_never_wrong_on_helm_mmlu(helm_rank):
    """Bank target: the whole bank known at the end, so every fully scored pair is decided and no
    ordering statement contradicts the exact bank order (over these reps)."""
    out = helm_rank
    s = out["summary"]
    assert s["target"] == "bank" and s["family_wise_error_rate"] == 0.0
    first = out["rankings"][0]
    assert all(c["verdict"] != "undecided" for c in first["comparisons"] if c["n_items"] == c["n_total"])


def test_select_without_json_prints_a_table_on_both_targets(capsys):
    """``backtest select`` without ``--json`` printed nothing and exited 3 (KeyError 'halfwidth': the bank target
    states its tolerance as epsilon)."""
    for target in ("bank", "distribution"):
        code = main(["backtest", "select", "--scores", "bundled:helm_raft", "--threshold", "0.6", "--halfwidth",
                     "0.05", "--reps", "1", "--batch-size", "100", "--target", target])
        out = capsys.readouterr().out
        assert code == 0 and "selection (rep 0)" in out, out
        assert ("epsilon 0.05" in out) == (target == "bank") and "items used" in out


@pytest.mark.parametrize("flags, named", [
    (["compare", "--history-fraction", "0.5"], "--history-fraction"),
    (["rank", "--target", "distribution", "--history-fraction", "0.5"], "--target distribution"),
    (["rank", "--history", "bundled:helm_mmlu", "--history-fraction", "0.5"], "not both"),
    (["select", "--threshold", "0.6", "--halfwidth", "0.05", "--history-permute"], "--history-permute")])
def test_history_a_comparative_backtest_cannot_use_is_refused_not_ignored(flags, named, capsys):
    """rank and select on the bank target take --history-fraction (tests/test_backtest_paired_history.py);
    compare, the distribution target, --history SOURCE with it and --history-permute are refused, never ignored."""
    code = _code(["backtest", flags[0], "--scores", "bundled:helm_mmlu", *flags[1:], "--reps", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and named in err, err


@pytest.mark.parametrize("target", ["bank", "distribution"])
def test_one_margin_rule_on_both_targets_a_difference_inside_the_margin_is_never_a_gt_b(target):
    """Model a beats b by 0.03 on a 6,000-item bank, margin 0.05: "a>b" claims a difference above the margin, so
    neither target may say it (the distribution target said it once its interval cleared 0); both may say
    "equivalent" once the interval lies inside (-0.05, 0.05)."""
    from certeval.backtests.comparative import ComparativeBacktest, compare_backtest
    from certeval.estimators.groups import GroupRequest
    from certeval.estimators.protocol import BankSpec

    rng = np.random.default_rng(4)
    n = 6000
    b = (rng.random(n) < 0.6).astype(float)
    a = b.copy()
    a[rng.choice(np.flatnonzero(b == 0), size=int(0.03 * n), replace=False)] = 1.0  # exactly +0.03
    request = GroupRequest(kind="compare", labels=(), target=target, margin=0.05, look_size=500)
    out = compare_backtest(ComparativeBacktest(np.vstack([a, b]), ("a", "b"), BankSpec(n_items=n), request, reps=4,
                                               seed=1, looks_every=500, n_pairs=1))
    verdicts = out["pairs"][0]["verdicts"]
    assert "a>b" not in verdicts and "b>a" not in verdicts, verdicts
    assert verdicts.get("equivalent", 0) >= 1, verdicts  # the rule can decide, it is not just silent


def test_epsilon_outside_a_ranking_backtest_is_refused_not_ignored(capsys):
    for command in (["--goal", "halfwidth:0.05"], ["compare"], ["select", "--threshold", "0.6", "--halfwidth", "0.05"],
                    ["rank", "--ranking", "all-pairs"]):
        code = _code(["backtest", *command, "--scores", "bundled:helm_mmlu", "--reps", "1"]
                    + ([] if command[0] == "rank" else ["--epsilon=0.05"]))  # "--epsilon 0.05": '0.05' is
        # read as backtest's COMMAND (an optional subcommand), and refused as that
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and ("--epsilon" in err), (command, err)


def test_kendall_tau_of_a_ranking_against_the_exact_order():
    from types import SimpleNamespace

    from certeval.backtests.paired_rows import kendall_tau

    exact = np.array([0.9, 0.5, 0.1])
    right = SimpleNamespace(tie_groups=(("a",), ("b",), ("c",)))
    reversed_ = SimpleNamespace(tie_groups=(("c",), ("b",), ("a",)))
    all_tied = SimpleNamespace(tie_groups=(("a", "b", "c"),))
    assert kendall_tau(right, ["a", "b", "c"], exact) == pytest.approx(1.0)
    assert kendall_tau(reversed_, ["a", "b", "c"], exact) == pytest.approx(-1.0)
    assert kendall_tau(all_tied, ["a", "b", "c"], exact) == 0.0  # no order stated: no agreement either
