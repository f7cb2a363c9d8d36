"""One backtest driver: ``certeval backtest`` (single-model goals) runs on the benchmarks' driver
(``certeval.backtests.ray_fanout.run_cells``) and reproduces the fixed-seed results of the driver it replaced.

``tests/data/backtest_removed_driver.json`` holds that removed driver's output (made by
``tests/data/make_backtest_removed_driver.py`` at commit 5da5bb3: 22 HELM-MMLU models, seed 11). The two drivers
key their seeds differently, so a rep's draws differ; what must agree is everything else: per model the truth
to the last few bits (the fixture was written on another machine: a mean summed in another order — SIMD width,
BLAS, pandas version — differs in the last bit, so floats are compared at ``rtol=1e-12``, never with ``==``), a case
where every rep is stopped by the budget in every number but the half-width, and the items and half-widths per
model within Monte-Carlo error — a paired z-test over the models, which fails when the kept driver builds the
bank, the features, the history or the budget differently (a 1% shift in items is ~4-5 SE here, on the 11 models
the stopping cases replay: a model's rows do not depend on which models run beside it, so every other fixture
model is a check of the same runs at half the cost; the budget case, cheap, keeps all 22). uniform and
adaptive run as they did then (``UNION``); the history method has changed since, so its items are only checked
to have dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom

from certeval.backtests.single import SingleBacktestOptions, run_single_backtest
from certeval.estimators import parse_goal
from certeval.inputs.banks import bank_from_scores, load_scores

FIXTURE = json.loads((Path(__file__).parent / "data" / "backtest_removed_driver.json").read_text())
# uniform and adaptive as the removed driver ran them: one CS per sub-dataset, union bound, all-times bets (their
# default is now one joint CS for the mean of means with bets tuned to the goal, which needs far fewer items:
# measured in benchmarks/exact_items.py, not against this fixture)
UNION = {"combine": "union", "bet_halfwidth": None}
CASES = {
    "uniform_hw05": dict(method="uniform", goal="halfwidth:0.05", reps=6, method_params=UNION),
    "adaptive_hw05": dict(method="adaptive", goal="halfwidth:0.05", reps=6, method_params=UNION),
    "seq_above05_budget": dict(method="seq", goal="above:0.5", reps=6, max_items=300),
    "history_frac05_hw05": dict(method="history", goal="halfwidth:0.05", reps=3, history_fraction=0.5,
                                baseline="uniform"),
}
# the fixture's models a case replays: every other one where a run stops on its own (z over 11 models); the budget
# case compares its whole summary exactly, so all 22
STRIDE = {"uniform_hw05": 2, "adaptive_hw05": 2, "seq_above05_budget": 1, "history_frac05_hw05": 2}


@pytest.fixture(scope="module")
def data():
    frame = load_scores(FIXTURE["scores"])
    return frame, bank_from_scores(frame), sorted(frame["model"].unique())


REL = 1e-12  # a few ulps of a mean of ~500 scores: summation order, not a different computation


def _close(new, old) -> bool:
    """``new == old`` with floats compared at ``REL`` (recursively through dicts and lists)."""
    if isinstance(old, dict):
        return isinstance(new, dict) and new.keys() == old.keys() and all(_close(new[k], old[k]) for k in old)
    if isinstance(old, list):
        return isinstance(new, list) and len(new) == len(old) and all(_close(a, b) for a, b in zip(new, old))
    if isinstance(old, float) or isinstance(new, float):
        return bool(np.isclose(new, old, rtol=REL, atol=0.0)) or (np.isnan(new) and np.isnan(old))
    return new == old


def test_the_tolerant_comparison_catches_a_real_difference():
    """The tolerance absorbs summation order, never a changed number (a test that cannot fail is a defect)."""
    old = FIXTURE["cases"]["uniform_hw05"]["models"][1]["truth"]
    assert _close(old * (1 + 1e-15), old) and _close({"a": [old]}, {"a": [old]})
    assert not _close(old + 1e-9, old) and not _close(old * (1 + 1e-10), old)
    assert not _close({"a": [old, 1]}, {"a": [old, 2]}) and not _close({"a": 1}, {"b": 1})


def _paired_z(old: list[float], new: list[float]) -> float:
    d = np.asarray(new) - np.asarray(old)
    se = d.std(ddof=1) / np.sqrt(len(d))
    return 0.0 if se == 0 and abs(d.mean()) < 1e-9 else float(d.mean() / max(se, 1e-12))


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_kept_driver_reproduces_the_removed_drivers_fixed_seed_results(data, case):
    frame, bank, all_models = data
    c = dict(CASES[case])
    old = FIXTURE["cases"][case]
    old_models = old["models"][::STRIDE[case]]
    models = all_models[::2][::STRIDE[case]]
    options = SingleBacktestOptions(c.pop("method"), parse_goal(c.pop("goal")), seed=FIXTURE["seed"], batch_size=10,
                                    **c)
    out = run_single_backtest(frame, bank, models, options, all_models=all_models)
    assert [m["model"] for m in out["models"]] == [m["model"] for m in old_models] == models
    assert _close([m["truth"] for m in out["models"]], [m["truth"] for m in old_models])
    assert out["n_items"] == old["n_items"] and _close(out["truth"], old["truth"])
    if case == "seq_above05_budget":  # every rep ends at the budget: only which items were drawn is random
        drop = lambda m: {k: v for k, v in m.items() if k != "mean_halfwidth"}  # noqa: E731
        assert _close([drop(m) for m in out["models"]], [drop(m) for m in old["models"]])
        assert _close(out["summary"], old["summary"])
        z = _paired_z([m["mean_halfwidth"] for m in old["models"]], [m["mean_halfwidth"] for m in out["models"]])
        assert abs(z) < 4, z
        return
    z = _paired_z([m["mean_scored"] for m in old_models], [m["mean_scored"] for m in out["models"]])
    # coverage at the stop: the misses of a 95% interval over these runs within a binomial tolerance (two misses in
    # 33 runs happen to a valid interval with probability ~0.5 at a 5% miss rate, so ">= 0.95" was a seed's luck)
    runs = len(models) * c["reps"]
    misses = round((1.0 - out["summary"]["coverage"]) * runs)
    assert misses <= binom.ppf(0.999, runs, 0.05), (misses, runs)
    assert old["summary"]["coverage"] >= 0.95
    old_fraction = np.mean([m["fraction_scored"] for m in old_models])
    if case == "history_frac05_hw05":
        # the history method itself changed since the fixture (bets tuned to the goal, truncation c = 0.8): the
        # driver must still build the same bank, history and truths (checked above), and the items only drop
        assert z < -4 and out["summary"]["mean_fraction_scored"] < old_fraction, z
    else:
        assert abs(z) < 4, z
        assert abs(out["summary"]["mean_fraction_scored"] - old_fraction) < 0.02
    if "ratio_to_uniform" in old["summary"]:
        # the baseline is today's uniform (one joint CS): fewer items than the union-bound uniform of the fixture
        new_base = [m["baseline_scored"] for m in out["models"]]
        old_base = [m["baseline_scored"] for m in old_models]
        assert np.mean(new_base) < 0.9 * np.mean(old_base), (np.mean(new_base), np.mean(old_base))
        assert out["summary"]["ratio_to_uniform"] < 1.0  # history still pays against the tighter uniform


def test_the_cli_backtest_and_the_benchmark_rows_are_the_same_runs(data):
    """A model's CLI numbers are the driver's rows for that model (same seeds: scores, model, method, rep)."""
    from certeval.backtests.cells import Cell, DatasetArrays
    from certeval.backtests.ray_fanout import run_cells
    from certeval.inputs.banks import score_matrix

    frame, bank, all_models = data
    model = all_models[3]
    out = run_single_backtest(frame, bank, [model], SingleBacktestOptions(
        "uniform", parse_goal("halfwidth:0.1"), reps=4, seed=3, batch_size=20), all_models=all_models)
    arrays = DatasetArrays(name="scores", spec=bank.spec(), models=(model,),
                           matrix=score_matrix(frame, [model], bank))
    rows = run_cells({"x": arrays}, [Cell("x", "uniform", "halfwidth:0.1", 4, 20,
                                          (("confidence", 0.95), ("target", "bank")))], 3)
    assert out["models"][0]["mean_scored"] == np.mean([r["n_scored"] for r in rows])
    assert out["models"][0]["coverage"] == np.mean([r["covered"] for r in rows])
