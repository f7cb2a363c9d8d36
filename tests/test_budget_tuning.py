"""Bets tuned to the horizon a run can reach, and history weighed by what it has shown it predicts.

* ``method_for_goal`` passes the goal's half-width and the item budget; ``bet_sizes`` then tunes to the smaller
  horizon (``ε_i = max(ε, sqrt(2 v_i ln(2/δ)(1/n* − 1/N)))``): an unreachable goal bets as the budget alone does,
  a reachable one as the goal alone does.
* Coverage with peeking (a look every 10 items, fixed seeds, 400 reps at δ = 0.1, a one-sided binomial bound at
  0.999) of the without-replacement betting CS with the re-tuned bets; a deliberately broken control (bets that
  see the observation they are staked on) must fail the same check.
* History that predicts nothing (items permuted) is not trusted: its out-of-sample slope fails the trust's one-sided
  test, the trust is 0 and the width at 100 items stays near the run without history; informative history keeps a
  trust near 1.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import binom

from certeval.estimators import BankSpec, method_for_goal, parse_goal
from certeval.estimators.history.prior import fit_history_prior
from certeval.estimators.single.bounds import BettingCS, bet_sizes, horizon_scale
from certeval.estimators.single.history import HistoryMethod

DELTA, REPS, N_ITEMS, LOOK, GRID = 0.1, 400, 60, 10, 257


def test_method_for_goal_passes_the_goal_and_the_budget():
    method = method_for_goal("uniform", parse_goal("halfwidth:0.001"), 100)
    assert (method.bet_halfwidth, method.bet_horizon) == (0.001, 100)
    method = method_for_goal("history", parse_goal("halfwidth:0.05"), None)
    assert (method.bet_halfwidth, method.bet_horizon) == (0.05, None)
    method = method_for_goal("uniform", parse_goal("above:0.5"), 80)
    assert (method.bet_halfwidth, method.bet_horizon) == (None, 80)


def test_bets_tune_to_the_smaller_horizon():
    i = np.arange(1.0, 11.0)
    alpha, var, log_bet = np.full(10, 1.2), np.full(10, 0.2), 2 * math.log(2 / DELTA)
    h = horizon_scale(100, 600)
    budget = bet_sizes(i, alpha, var, log_bet, None, h)
    # a goal the budget cannot reach: the budget's bets
    np.testing.assert_allclose(bet_sizes(i, alpha, var, log_bet, 0.001, h), budget)
    # a goal reached before the budget (ε above the budget's reachable half-width): the goal's bets
    goal = bet_sizes(i, alpha, var, log_bet, 0.3, None)
    np.testing.assert_allclose(bet_sizes(i, alpha, var, log_bet, 0.3, h), goal)
    assert (goal > budget).all()


def _bank(rng: np.random.Generator, p: float) -> np.ndarray:
    return (rng.random(N_ITEMS) < p).astype(float)


def test_unreachable_goal_is_as_narrow_as_the_budget_alone():
    rng = np.random.default_rng(3)
    x = _bank(rng, 0.4)
    order = rng.permutation(N_ITEMS)[:40]
    widths = {}
    for label, tuning in {"goal": {"bet_halfwidth": 0.001}, "both": {"bet_halfwidth": 0.001, "bet_horizon": 40},
                          "budget": {"bet_horizon": 40}}.items():
        cs = BettingCS(DELTA, N_ITEMS, grid_size=1025, **tuning)
        cs.update(x[order])
        widths[label] = cs.interval()[1] - cs.interval()[0]
    assert widths["both"] == pytest.approx(widths["budget"])
    assert widths["goal"] > 1.5 * widths["both"]


class PeekingBetsCS(BettingCS):
    """Deliberately invalid (test only): each bet is scaled up when its own observation is high, so it is not
    predictable and the capital at the true mean grows."""

    def _bets(self, x):
        return super()._bets(x) * (0.2 + 4.0 * x)


def _misses(cls, tuning: dict, p: float, seed: int) -> int:
    misses = 0
    for r in range(REPS):
        rng = np.random.default_rng([seed, r])
        x = _bank(rng, p)
        truth, order = x.mean(), rng.permutation(N_ITEMS)
        cs = cls(DELTA, N_ITEMS, grid_size=GRID, **tuning)
        for start in range(0, N_ITEMS, LOOK):
            cs.update(x[order[start:start + LOOK]])
            lo, hi = cs.interval()
            if not lo - 1e-12 <= truth <= hi + 1e-12:
                misses += 1
                break
    return misses


TOLERANCE = int(binom.ppf(0.999, REPS, DELTA))
TUNINGS = {"goal-unreachable": {"bet_halfwidth": 0.001, "bet_horizon": 30},
           "goal-reachable": {"bet_halfwidth": 0.3, "bet_horizon": 30}}


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_retuned_bets_cover_with_peeking(tuning, p):
    misses = _misses(BettingCS, TUNINGS[tuning], p, seed=11)
    assert misses <= TOLERANCE, f"missed in {misses}/{REPS} runs (tolerance {TOLERANCE})"


def test_bets_that_see_their_observation_are_caught_by_the_same_check():
    misses = _misses(PeekingBetsCS, TUNINGS["goal-unreachable"], 0.5, seed=11)
    assert misses > TOLERANCE, f"the peeking bets slipped through ({misses}/{REPS})"


def _population(rng: np.random.Generator, n_models: int, n_items: int) -> np.ndarray:
    v, c, u = rng.normal(size=(n_items, 2)), rng.normal(scale=1.5, size=n_items), rng.normal(size=(n_models, 2))
    return (rng.random((n_models, n_items)) < 1.0 / (1.0 + np.exp(-(u @ v.T + c)))).astype(float)


def _history_run(spec: BankSpec, x: np.ndarray, rng: np.random.Generator, n: int) -> HistoryMethod:
    method = HistoryMethod(confidence=1 - DELTA, grid_size=1025, subset_intervals=False, bet_horizon=n).start(spec)
    while method.n_scored < n:
        prop = method.propose(10, rng)
        method.update(prop.items, x[prop.items])
    return method


def test_useless_history_loses_its_trust_and_costs_little_width():
    rng = np.random.default_rng(5)
    pop = _population(rng, 31, 400)
    x, prior = pop[-1], fit_history_prior(pop[:-1], n_factors=2)
    trusts, ratios = {"informative": [], "permuted": []}, []
    for r in range(6):
        spec = BankSpec(400, history=prior)
        permuted = replace(spec, history=prior.permuted(np.random.default_rng([9, r])))
        widths = {}
        for label, s in (("informative", spec), ("permuted", permuted)):
            method = _history_run(s, x, np.random.default_rng([7, r]), 100)
            est = method.result()
            widths[label] = est.upper - est.lower
            trusts[label].append(method.history_trust(*method._prediction_parts()[1:]))
        # the same draws without history: a constant control variate is the run without history
        blind = replace(spec, history=replace(prior, item_mean=np.full(400, 0.5), factors=prior.factors * 0.0))
        est = _history_run(blind, x, np.random.default_rng([7, r]), 100).result()
        ratios.append(widths["permuted"] / (est.upper - est.lower))
    # the permuted history fails the trust's test (level 0.05) at the last look in most reps: trust exactly 0
    assert np.median(trusts["permuted"]) == 0.0 and np.median(trusts["informative"]) > 0.8, trusts
    assert np.median(ratios) < 1.05, ratios
