"""Monte-Carlo coverage of every single-model method on Bernoulli banks, with peeking.

For anytime-valid methods the interval is checked at every look (a miss at any
look counts); ``static`` only promises its interval at the full bank. The
miscoverage must stay within a binomial tolerance of δ; a deliberately
miscalibrated radius (Wald at every look) must fail the same check.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from scipy.stats import binom

from certeval.estimators import BankSpec, make_method
from certeval.estimators.single.strata import StratifiedMethod

DELTA = 0.1  # confidence 0.9: misses are frequent enough to catch a bad radius with few reps
REPS = 30


class WaldEveryLook(StratifiedMethod):
    """Deliberately miscalibrated: x̄ ± 1.645 sd/√n, re-checked at every look (not registered)."""

    name = "wald-test-only"

    def _stratum_interval(self, h):
        n = self.stratum_n_[h]
        mean = self._stratum_mean(h)
        sd = math.sqrt(max(self.stratum_sumsq_[h] / n - mean * mean, 0.0))
        r = 1.645 * sd / math.sqrt(n)
        return self._clip_to_feasible(h, mean - r, mean + r)


def _make(name):
    if name == "wald":
        return WaldEveryLook(confidence=1 - DELTA)
    name, _, tuning = name.partition("@")  # "uniform@hw": bets tuned to a half-width of 0.05, "@h": to 200 items
    params = {"hw": {"bet_halfwidth": 0.05}, "h": {"bet_horizon": 200}, "": {}}[tuning]
    return make_method(name, confidence=1 - DELTA, **params)


def miscoverage(name: str, p: float, n_items: int, reps: int, batch: int, horizon: int, seed: int) -> int:
    """Number of reps in which some look's interval (only the final one for static) misses the bank mean."""
    misses = 0
    for r in range(reps):
        rng = np.random.default_rng([seed, r])
        x = (rng.random(n_items) < p).astype(float)
        truth = x.mean()
        features = rng.normal(size=(n_items, 2)) + x[:, None]  # informative features for cer-eval
        method = _make(name)
        method.start(BankSpec(n_items, features=features))
        missed = False
        while method.n_scored < horizon:
            prop = method.propose(batch, rng)
            method.update(prop.items, x[prop.items])
            est = method.result()
            if name == "static" and not est.exhausted:
                continue
            if not (est.lower - 1e-12 <= truth <= est.upper + 1e-12):
                missed = True
                break
        misses += missed
    return misses


def tolerance(reps: int) -> int:
    return int(binom.ppf(0.999, reps, DELTA))


# Skewed and balanced banks at 50 items, and a balanced 5,000-item bank peeked every 50 items (the betting grids at a
# large n). The power against a 2x miscalibration lives in tests/test_conformance.py (200 runs per cell); these 30-rep
# cases are a second, independent simulation loop with a looser net.
CASES = [(0.02, 50), (0.5, 50), (0.98, 50), pytest.param(0.5, 5000, marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", ["static", "seq", "cer-eval", "uniform", "adaptive", "uniform@hw", "uniform@h",
                                  "adaptive@hw"])
@pytest.mark.parametrize("p,n_items", CASES)
def test_miscoverage_within_binomial_tolerance(name, p, n_items):
    if n_items == 50:
        batch, horizon = 5, 50
    else:  # peek every 50 items over the first 600 (static: one batch, the whole bank)
        batch, horizon = (5000, 5000) if name == "static" else (50, 600)
    reps = REPS
    if name == "cer-eval" and n_items == 5000:  # its 1-NN refits dominate the run time
        reps, horizon = 20, 600
    misses = miscoverage(name, p, n_items, reps, batch, horizon, seed=zlib.crc32(f"{name}-{p}-{n_items}".encode()))
    assert misses <= tolerance(reps), f"{name} missed in {misses}/{reps} runs"


@pytest.mark.parametrize("p,n_items", [(0.5, 5000), (0.02, 50)])
def test_wald_at_every_look_is_caught(p, n_items):
    batch, horizon = (50, 600) if n_items == 5000 else (5, 50)
    misses = miscoverage("wald", p, n_items, REPS, batch, horizon, seed=7)
    assert misses > tolerance(REPS), f"the miscalibrated radius slipped through ({misses}/{REPS})"
