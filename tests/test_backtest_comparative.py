"""Comparative backtest on bundled real data, through the command line's entry (a Namespace → typed options →
:func:`certeval.backtests.comparative.comparative_backtest` → printed)."""

from __future__ import annotations

import io
import json
from argparse import Namespace
from contextlib import redirect_stdout

import numpy as np
import pandas as pd
import pytest

from certeval.backtests.comparative import parse_comparative_goal
from certeval.cli.backtest import run_comparative_backtest
from certeval.errors import InputError


def _args(**kw):
    base = dict(scores="bundled:helm_mmlu", items=None, model=None, goal="rank:0.02", confidence=0.95, reps=2, seed=0,
                batch_size=None, max_items=None, json=True, statistic="paired", spending="pocock", looks_every=100,
                pairs=20)
    base.update(kw)
    return Namespace(**base)


@pytest.fixture(scope="module")
def helm_rank():
    """One bank-target rank backtest on helm_mmlu (44 models, 2 reps, a look every 50 items) through the command
    line's entry, shared by the checks below: the run is what costs, each check reads it. Returns the backtest's
    dict and the JSON it printed."""
    from certeval.backtests import comparative

    real, kept = comparative.comparative_backtest, {}

    def keep(opts):
        kept["out"] = real(opts)
        return kept["out"]

    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, redirect_stdout(printed):
        mp.setattr(comparative, "comparative_backtest", keep)
        assert run_comparative_backtest(_args(reps=2, looks_every=50)) == 0
    return kept["out"], json.loads(printed.getvalue())


@pytest.mark.slow
def test_rank_helm_mmlu_prints_tie_groups(helm_rank, capsys, monkeypatch):
    from certeval.backtests import comparative

    monkeypatch.setattr(comparative, "comparative_backtest", lambda opts: helm_rank[0])  # the shared run, as a table
    assert run_comparative_backtest(_args(json=False, reps=2, looks_every=50)) == 0
    out = capsys.readouterr().out
    assert "tie groups" in out and "writer_palmyra-x" in out


@pytest.mark.slow
def test_rank_json_has_rankings_and_summary(helm_rank):
    out = helm_rank[1]
    assert len(out["rankings"]) == 2 and len(out["rankings"][0]["models"]) == 44
    assert out["summary"]["family_wise_error_rate"] <= 0.5
    assert sum(len(g) for g in out["rankings"][0]["tie_groups"]) == 44


def test_compare_json_pairs(capsys):
    assert run_comparative_backtest(_args(scores="bundled:vlm_ocrbench", goal="compare:0", reps=2, pairs=15)) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["pairs"]) == 15
    s = out["summary"]
    assert 0 < s["fraction_used"] <= 1 and 0 <= s["separated"] <= 1
    assert s["directional_error_rate"] <= 0.05


def test_select_json(capsys):
    assert run_comparative_backtest(_args(scores="bundled:helm_raft", goal="select:0.6,0.05", reps=1)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["wrong_discard_rate"] == 0.0 and out["runs"][0]["discarded"]


def test_pair_without_shared_items_is_input_error(tmp_path):
    frame = pd.DataFrame({"model": ["a", "a", "b", "b"], "item_id": ["1", "2", "3", "4"], "score": [1.0, 0, 1, 0]})
    path = tmp_path / "scores.parquet"
    frame.to_parquet(path)
    with pytest.raises(InputError, match="share no scored items"):
        run_comparative_backtest(_args(scores=str(path), goal="compare:0"))


@pytest.mark.parametrize("goal", ["compare", "rank:x", "select:0.5", "select:0.5,0", "foo:1", "compare:1.5"])
def test_bad_goals(goal):
    with pytest.raises(InputError):
        parse_comparative_goal(goal)


def test_unknown_model_is_input_error():
    with pytest.raises(InputError, match="unknown model"):
        run_comparative_backtest(_args(model=["nope", "writer_palmyra-x"]))


@pytest.mark.parametrize("goal", ["rank:0.02", "compare:0", "select:0.3,0.05"])
def test_distribution_target_still_answers_with_group_sequential_tests(goal, capsys):
    assert run_comparative_backtest(_args(goal=goal, target="distribution", reps=1)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["target"] == out["summary"]["target"] == "distribution"


@pytest.mark.slow
def test_bank_rank_backtest_states_are_exact_and_never_wrong_on_helm_mmlu(helm_rank):
    """Bank target: the whole bank known at the end, so every fully scored pair is decided and no
    ordering statement contradicts the exact bank order (over these reps)."""
    out = helm_rank[1]
    s = out["summary"]
    assert s["target"] == "bank" and s["family_wise_error_rate"] == 0.0
    first = out["rankings"][0]
    assert all(c["verdict"] != "undecided" for c in first["comparisons"] if c["n_items"] == c["n_total"])


def test_select_without_json_prints_a_table_on_both_targets(capsys):
    """``backtest --goal select:T,E`` without ``--json`` printed nothing and exited 3 (KeyError 'halfwidth': the
    bank target states its tolerance as epsilon)."""
    from certeval.cli import main

    for target in ("bank", "distribution"):
        code = main(["backtest", "--scores", "bundled:helm_raft", "--goal", "select:0.6,0.05", "--reps", "1",
                     "--target", target])
        out = capsys.readouterr().out
        assert code == 0 and "selection (rep 0)" in out, out
        assert ("epsilon 0.05" in out) == (target == "bank") and "items used" in out


@pytest.mark.parametrize("flags", [["--goal", "compare:0", "--history-fraction", "0.5"],
                                   ["--goal", "rank:0.02", "--target", "distribution", "--history-fraction", "0.5"],
                                   ["--goal", "rank:0.02", "--history", "bundled:helm_mmlu"],
                                   ["--goal", "select:0.6,0.05", "--history-permute"]])
def test_history_a_comparative_backtest_cannot_use_is_refused_not_ignored(flags, capsys):
    """rank and select on the bank target take --history-fraction (tests/test_backtest_paired_history.py);
    compare, the distribution target, --history SOURCE and --history-permute are refused, never ignored."""
    from certeval.cli import main

    code = main(["backtest", "--scores", "bundled:helm_mmlu", *flags, "--reps", "1"])
    err = capsys.readouterr().err.strip()
    named = next(f for f in flags if f.startswith("--history"))
    assert code == 2 and len(err.splitlines()) == 1 and named in err and flags[1] in err, err


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
    from certeval.cli import main

    for goal in ("halfwidth:0.05", "compare:0", "rank:0.02"):
        code = main(["backtest", "--scores", "bundled:helm_mmlu", "--goal", goal, "--epsilon", "0.05", "--reps", "1"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "--epsilon" in err, (goal, err)


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
