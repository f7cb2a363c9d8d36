"""Leaderboard precision (``rank --goal halfwidth:E``, bank target): every model's bank mean within ±E,
simultaneously at any stopping time, and "a>b" only where two intervals do not overlap. Checked by Monte Carlo
with a look every 25 items against the exact bank means; the same check catches intervals shrunk by a third."""

from __future__ import annotations

import json

import numpy as np
from scipy import stats

from certeval.estimators.bank.precision import BankPrecision


def _board(seed: int, m: int = 12, n: int = 400) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.2, 0.8, m)
    return (rng.random((m, n)) < p[:, None]).astype(float)


def _run(x: np.ndarray, rng: np.random.Generator, halfwidth: float, alpha: float) -> BankPrecision:
    m, n = x.shape
    board = BankPrecision([f"m{k}" for k in range(m)], halfwidth=halfwidth, alpha=alpha).start(np.full(n, 1 / n))
    order = rng.permutation(n)
    for start in range(0, n, 25):
        board.update(order[start:start + 25], x[:, order[start:start + 25]])
        if not board.active:
            break
    return board


def _misses(shrink: float, reps: int = 60, alpha: float = 0.1) -> int:
    """Runs in which some model's interval (shrunk around its estimate by ``shrink``) missed its exact mean, or a
    statement a>b contradicted the exact means."""
    misses = 0
    for rep in range(reps):
        x = _board(rep)
        board = _run(x, np.random.default_rng(500 + rep), 0.12, alpha)
        exact = x.mean(axis=1)
        centre = board.mean
        lower = centre - (centre - board.lower) * (1 - shrink)
        upper = centre + (board.upper - centre) * (1 - shrink)
        covered = (lower <= exact + 1e-12) & (exact <= upper + 1e-12)
        ranking = board.result()
        index = {name: k for k, name in enumerate(board.names)}
        wrong = any(exact[index[c.model_a]] <= exact[index[c.model_b]] for c in ranking.comparisons
                    if c.verdict == "a>b") or any(exact[index[c.model_b]] <= exact[index[c.model_a]]
                                                  for c in ranking.comparisons if c.verdict == "b>a")
        misses += (not covered.all()) or (shrink == 0 and wrong)
    return misses


def test_every_interval_is_precise_and_simultaneously_covers_and_shrunk_intervals_are_caught():
    bound = stats.binom.ppf(0.999, 60, 0.1)
    valid, shrunk = _misses(0.0), _misses(1 / 3)
    assert valid <= bound < shrunk, (valid, bound, shrunk)
    board = _run(_board(0), np.random.default_rng(0), 0.12, 0.1)
    widths = (board.upper - board.lower) / 2
    assert (widths <= 0.12 + 1e-12).all() and board.n < board.n_total  # precise before the bank ran out


def test_a_live_leaderboard_run_states_precision_and_every_interval_meets_it(tmp_path):
    """Through the pipeline's round loop (no Ray or Prefect: the replay backend's own worker)."""
    from benchmarks.state_size import drive
    from certeval.requests import Rank
    from certeval.runs.plan import make_plan

    from test_pipeline_support import MIDDLE, STRONG, WEAK, replay, small_scores

    scores = small_scores(tmp_path, n_items=400)
    plan, _ = make_plan(Rank(models=[replay(m, scores) for m in (STRONG, MIDDLE, WEAK)],
                                    goal="halfwidth:0.15", output=str(tmp_path / "runs"), run_id="board",
                                    batch_size=20, seed=1))
    run = drive(plan)
    results = json.loads((tmp_path / "runs" / "board" / "results.json").read_text())
    assert results["ranking"]["statement"] == "precision" and results["ranking"]["halfwidth"] == 0.15
    assert results["config"]["goal"] == "halfwidth:0.15" and run.exit_code() == 0
    for m in results["models"]:
        assert m["halfwidth"] <= 0.15 + 1e-12 and m["n_scored"] < m["n_total"], m
        assert m["decision"]["reached"] and "simultaneous over the 3 models" in m["guarantee"]
