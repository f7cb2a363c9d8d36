"""``certeval backtest --method faq`` (``run_faq_backtest``: typed options → ``faq_backtest`` → printed): history/new split, JSON keys, uniform side by side, one-line errors on bad input."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit

from certeval.backtests.faq import resolve_budget, split_models
from certeval.cli.backtest import run_faq_backtest
from certeval.errors import InputError


def _scores_file(tmp_path, m=24, n=50, seed=0, nan_at=None):
    rng = np.random.default_rng(seed)
    u = rng.normal(0.3, 1.0, (m, 2))
    v = rng.normal(0.0, 1.3, (n, 2))
    z = (rng.random((m, n)) < expit(u @ v.T)).astype(float)
    rows = [(f"model{i:02d}", f"q{j}", z[i, j]) for i in range(m) for j in range(n)]
    frame = pd.DataFrame(rows, columns=["model", "item_id", "score"])
    if nan_at is not None:
        frame.loc[nan_at, "score"] = np.nan
    path = tmp_path / "scores.parquet"
    frame.to_parquet(path)
    return path


def _args(scores, **kw):
    base = dict(scores=str(scores), items=None, model=None, method="faq", confidence=0.95, reps=6, seed=3, json=True,
                history_models=None, history_fraction=0.5, budget=0.2, missing=None, ci=None, batch_size=1)
    base.update(kw)
    return argparse.Namespace(**base)


def test_backtest_reports_summary_and_per_model_keys(tmp_path, capsys):
    path = _scores_file(tmp_path)
    assert run_faq_backtest(_args(path)) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("coverage", "mean_halfwidth", "ess_ratio", "paper_coverage", "uniform_coverage", "uniform_mean_halfwidth"):
        assert key in out["summary"]
    assert out["history_models"] == 12 and out["new_models"] == 12 and out["budget"] == 10
    assert len(out["per_model"]) == 12
    assert {"model", "coverage", "mean_halfwidth", "ess_ratio"} <= set(out["per_model"][0])
    assert 0.0 <= out["summary"]["coverage"] <= 1.0 and out["summary"]["ess_ratio"] > 0


def test_backtest_with_sparse_history_named_models_and_anytime_ci(tmp_path, capsys):
    path = _scores_file(tmp_path)
    args = _args(path, history_models=10, history_fraction=None, missing=0.9, ci="anytime", budget=8, model=["model20", "model23"])
    assert run_faq_backtest(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in out["per_model"]] == ["model20", "model23"]
    assert out["summary"]["coverage"] == out["summary"]["anytime_coverage"]


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(history_models=1, history_fraction=None), "at least 2 models"),
        (dict(history_fraction=0.04), "at least 2 models"),
        (dict(budget=51), "exceeds the bank"),
        (dict(budget=0.01), "at least 2"),
        (dict(model=["model01"]), "history model"),
        (dict(ci="wald"), "ci must be one of"),
    ],
)
def test_bad_input_is_one_line_input_error(tmp_path, changes, message):
    path = _scores_file(tmp_path)
    with pytest.raises(InputError, match=message) as err:
        run_faq_backtest(_args(path, **changes))
    assert "\n" not in str(err.value)


def test_nan_scores_and_items_without_overlap_are_refused(tmp_path):
    path = _scores_file(tmp_path, nan_at=7)
    with pytest.raises(InputError, match="NaN"):
        run_faq_backtest(_args(path))
    good = _scores_file(tmp_path)
    items = tmp_path / "items.csv"
    pd.DataFrame({"item_id": ["other1", "other2"]}).to_csv(items, index=False)
    with pytest.raises(InputError, match="shares no item"):
        run_faq_backtest(_args(good, items=str(items)))


def test_split_and_budget_helpers():
    assert split_models(list("abcdef"), 2, None) == (["a", "b"], ["c", "d", "e", "f"])
    with pytest.raises(InputError, match="no new model"):
        split_models(list("abc"), 3, None)
    assert resolve_budget(0.1, 493) == 49 and resolve_budget(25, 493) == 25
    with pytest.raises(InputError, match="integer"):
        resolve_budget(2.5, 100)


def test_cli_exit_codes(tmp_path, capsys):
    from certeval.cli import main

    path = _scores_file(tmp_path, m=12, n=30)
    assert main(["backtest", "--method", "faq", "--scores", str(path), "--history-models", "1", "--budget", "0.2"]) == 2
    assert "at least 2 models" in capsys.readouterr().err
    assert main(["backtest", "--method", "faq", "--scores", str(path), "--budget", "31"]) == 2
    code = main(["backtest", "--method", "faq", "--scores", str(path), "--history-models", "6", "--reps", "3", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["budget"] == 3  # default budget: 10 % of 30 items
