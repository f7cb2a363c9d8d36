"""``certeval backtest rank|select --history-fraction F``: each rep ranks (selects) a random share of
the models with one factor model fitted on the others as history — issue 25's "half the other models as history",
through the product's own backtest."""

from __future__ import annotations

import json

import numpy as np
import pytest

from certeval.backtests.paired_rows import history_count, history_split
from certeval.cli import main


def _run(capsys, command: str, *flags: str) -> dict:
    code = main(["backtest", command, "--scores", "bundled:helm_mmlu", "--json", "--quiet", *flags])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_rank_with_half_the_models_as_history_runs_the_other_half_with_their_prior(capsys):
    flags = ("rank", "--epsilon", "0.1", "--history-fraction", "0.5", "--reps", "2", "--batch-size", "50",
             "--seed", "3")
    out = _run(capsys, *flags)
    s = out["summary"]
    assert s["models"] == 22 and s["pairs"] == 22 * 21 // 2
    assert s["history"]["history_models"] == 22 and s["history"]["run_models"] == 22
    assert s["family_wise_error_rate"] == 0.0 and 0.0 < s["fraction_used"] < 1.0
    assert "history prediction" in s["guarantee"], s["guarantee"]  # the history ranking ran, not the plain one
    ranked = set(out["rankings"][0]["models"])
    splits = [set(r["history_models"]) for r in out["rankings"]]
    assert len(ranked) == 22 and not ranked & splits[0] and len(splits[0]) == 22
    assert splits[0] != splits[1]  # every rep draws its own split
    again = _run(capsys, *flags)  # keyed by the seed: the same splits and numbers
    assert [r["history_models"] for r in again["rankings"]] == [r["history_models"] for r in out["rankings"]]
    assert again["summary"]["fraction_used"] == s["fraction_used"]


def test_select_with_history_share_uses_the_history_selection(capsys):
    out = _run(capsys, "select", "--threshold", "0", "--halfwidth", "0.02", "--history-fraction", "0.5", "--reps", "1",
               "--batch-size", "50")
    s = out["summary"]
    assert s["models"] == 22 and s["history"]["history_models"] == 22 and s["error_rate"] == 0.0
    run = out["runs"][0]
    assert len(run["models"]) == 22 and not {m["model"] for m in run["models"]} & set(run["history_models"])
    assert "whatever the history" in s["guarantee"], s["guarantee"]  # the history selection ran
    # the same models on the same order without history, beside it (what the history saved)
    assert 0.0 < s["fraction_used_without_history"] <= 1.0
    assert s["history_vs_without"] == pytest.approx(s["fraction_used"] / s["fraction_used_without_history"])


@pytest.mark.parametrize("flags, named", [
    (["--epsilon", "0.1", "--history-fraction", "1"], "--history-fraction must lie in (0, 1)"),
    (["--epsilon", "0.1", "--history-fraction=-0.2"], "-0.2"),
    (["--history-fraction", "0.5", "--model", "writer_palmyra-x", "--model", "openai_ada"], "at least three models"),
])
def test_bad_history_share_exits_2_naming_it(flags, named, capsys):
    code = main(["backtest", "rank", "--scores", "bundled:helm_mmlu", "--reps", "1", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and named in err, err


@pytest.mark.parametrize("models, fraction, expected", [(44, 0.5, 22), (3, 0.9, 1), (3, 0.01, 1), (10, 0.25, 2)])
def test_history_count_keeps_one_history_model_and_two_run(models, fraction, expected):
    assert history_count(models, fraction) == expected
    hist, run = history_split(np.arange(models), fraction, np.random.default_rng(0))
    assert len(hist) == expected and len(run) == models - expected and not set(hist) & set(run)
