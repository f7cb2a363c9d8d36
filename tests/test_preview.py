"""The cost preview (``rank|select --dry-run --history``): no model call, nothing written, the user's own models never
stand in, and its prediction agrees with runs on held-out models (a preview that ignored the statement is caught)."""

from __future__ import annotations

import json
from argparse import Namespace
from dataclasses import replace

import numpy as np
import pytest

from certeval.cli import main
from certeval.errors import InputError
from certeval.estimators.groups import GroupRequest
from certeval.reports.preview import history_matrix, preview_cost

MODELS = ("openai_davinci", "openai_ada", "together_opt-66b", "openai_gpt-3.5-turbo-0301")
ARGS = [a for m in MODELS for a in ("--model", f"replay:bundled:helm_mmlu#{m}")]


def test_rank_dry_run_previews_on_the_other_recorded_models_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "runs"
    rc = main(["rank", *ARGS, "--epsilon", "0.1", "--dry-run", "--history", "bundled:helm_mmlu",
               "--output", str(out), "--json"])
    assert rc == 0
    got = json.loads(capsys.readouterr().out)["preview"]
    assert got["n_models"] == 4 and got["n_items"] == 567 and got["simulated_models"] == 4
    assert got["history_models"] == 44 - 4  # the user's own models never stand in for themselves
    assert got["fraction_low"] <= got["fraction"] <= got["fraction_high"] <= 1.0 and len(got["fractions"]) == 10
    assert got["cells"] == round(got["fraction"] * 4 * 567) and "epsilon 0.1" in got["statement"]
    assert not out.exists()


def test_select_dry_run_prints_the_prediction_and_its_range(tmp_path, capsys):
    rc = main(["select", *ARGS, "--halfwidth", "0.02", "--dry-run", "--history", "bundled:helm_mmlu",
               "--output", str(tmp_path / "runs")])
    text = capsys.readouterr().out
    assert rc == 0 and "cost preview (select, top-1 within 0.02" in text and "of the cells (range" in text
    assert "not a guarantee" in text and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("extra, message", [
    ([], "--dry-run predicts the cells from recorded models: give --history"),
    (["--history", "bundled:helm_mmlu", "--epsilon", "2"], "--epsilon"),
])
def test_bad_dry_runs_exit_2_with_one_line(tmp_path, capsys, extra, message):
    rc = main(["rank", *ARGS, "--dry-run", *extra, "--output", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_preview_refuses_what_it_cannot_play():
    spec = Namespace()
    with pytest.raises(InputError, match="for rank and select"):
        preview_cost(GroupRequest(kind="compare", labels=()), spec, np.zeros((3, 5)), 2)
    with pytest.raises(InputError, match="at least 2 recorded models"):
        preview_cost(GroupRequest(kind="rank", labels=()), spec, np.zeros((1, 5)), 2)


def test_history_matrix_keeps_complete_rows_of_other_models():
    import pandas as pd

    frame = pd.DataFrame({"model": ["a", "a", "b", "c", "c"], "item_id": ["1", "2", "1", "1", "2"],
                          "score": [1.0, 0.0, 1.0, 0.0, 1.0]})
    matrix, models = history_matrix(frame, ["1", "2"], exclude={"c"})
    assert models == ["a"] and matrix.tolist() == [[1.0, 0.0]]  # b lacks item 2; c is the user's model


def _halves(seed: int = 0):
    from certeval.backtests.comparative import load_matrix

    matrix, models, spec = load_matrix("bundled:helm_mmlu")
    order = np.random.default_rng(seed).permutation(len(models))
    return matrix[order[:22]], matrix[order[22:]], spec


def test_the_preview_from_other_models_predicts_runs_on_held_out_models_and_a_wrong_statement_is_caught():
    yours, history, spec = _halves()
    ask = GroupRequest(kind="rank", labels=(), epsilon=0.1, look_size=50)
    predicted = preview_cost(ask, spec, history, len(yours), reps=2, seed=3).fraction
    realised = np.mean(preview_cost(ask, spec, yours, len(yours), reps=2, seed=4).fractions)
    assert abs(predicted - realised) <= 0.1, (predicted, realised)
    # control: a preview that played strict verdicts (margin 0) instead of the user's epsilon misses by far
    strict = preview_cost(replace(ask, epsilon=None), spec, history, len(yours), reps=1, seed=3).fraction
    assert abs(strict - realised) > 0.1, (strict, realised)
