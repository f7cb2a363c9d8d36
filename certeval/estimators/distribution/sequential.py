"""Per-model sequential testing on the round protocol.

The stopping rules (precision, threshold crossing, futility, diminishing returns, Arviv et al. 2026 §5.3) and
:class:`SequentialTest` are defined once, in :mod:`certeval.estimators.goals`, which the CLI's goals are built from; they are
importable from here too.

:class:`GroupSequentialMean` is the method's own statistic: the (mean-of-means) bank
mean with a repeated confidence interval (Jennison & Turnbull 2000, ch. 9) whose
multiplier at look k comes from a spending function evaluated at the information
fraction ``n_k / N`` — valid at unplanned looks, not anytime-valid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# one stopping-rule system: the rules and SequentialTest live in .goals (a CLI goal is a named set of them)
from ..protocol import BankMethod, register
from ..results import Estimate
from ..validation import check_positive
from .boundaries import CLASSICAL, group_sequential_boundary, parse_spending


# --------------------------------------------------------------------------- mean of means
def mean_of_means(values: np.ndarray, subsets: np.ndarray | None = None, n_subsets: int | None = None,
                  *, var_floor: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Mean-of-means over sub-datasets and the variance of that estimate (Arviv et al. 2026, eq. 1).

    ``values``: ``(..., n)`` per-item values (scores, or paired differences).  With ``subsets``
    (one integer code per column, ``n_subsets`` codes in the bank) the statistic is
    ``sum_s mean_s / S`` with variance ``sum_s var_s / (n_s S^2)`` (per-subset sample
    variances, ddof = 1); without, the plain mean and ``var / n``.  A subset with fewer than
    two scored items leaves the variance undefined (NaN): the estimand is not yet estimable.
    ``var_floor`` keeps each variance >= 1/n (one disagreement's worth for 0/1 data) so an
    all-equal early sample never yields a zero-width interval.
    """
    x = np.asarray(values, dtype=float)
    if subsets is None:
        n = x.shape[-1]
        if n < 2:
            return x.mean(axis=-1) if n else np.full(x.shape[:-1], np.nan), np.full(x.shape[:-1], np.nan)
        var = x.var(axis=-1, ddof=1)
        if var_floor:
            var = np.maximum(var, 1.0 / n)
        return x.mean(axis=-1), var / n
    codes = np.asarray(subsets, dtype=np.int64)
    count = int(n_subsets if n_subsets is not None else codes.max() + 1)
    means, variances = [], []
    for s in range(count):
        cols = codes == s
        n_s = int(cols.sum())
        if n_s < 2:
            nan = np.full(x.shape[:-1], np.nan)
            return nan, nan
        part = x[..., cols]
        var = part.var(axis=-1, ddof=1)
        if var_floor:
            var = np.maximum(var, 1.0 / n_s)
        means.append(part.mean(axis=-1))
        variances.append(var / n_s)
    return np.mean(means, axis=0), np.sum(variances, axis=0) / count**2


# --------------------------------------------------------------------------- GST statistic
@register
class GroupSequentialMean(BankMethod):
    """Uniform sampling without replacement; repeated CI from a group-sequential boundary.

    At look k with ``n_k`` items scored the interval is ``mean +- c_k se`` where ``c_k`` is the
    two-sided boundary of ``spending`` at fractions ``n_1/N, ..., n_k/N`` (Jennison & Turnbull
    2000, §9.1, repeated confidence intervals); the mean is the mean-of-means over subsets
    when the bank has them (Arviv et al. 2026, eq. 1).  Simultaneous coverage over the looks taken,
    not anytime-valid, and only asymptotically: ``se`` is estimated, so each look's interval is a Wald
    interval and the guarantee rests on the normal approximation (``validity = "asymptotic"`` on both
    targets; on the bank target the interval is exact only once the bank is exhausted, where it has zero
    width). Measured with peeking (``benchmarks/results/gst_coverage.json``): at confidence 0.9 it misses
    a Bernoulli(0.01-0.05) mean at some look in far more than 10% of runs.  Classical boundaries (``pocock``, ``obrien-fleming``) need the plan:
    looks of ``look_size`` items up to the bank size.
    """

    name = "gst"
    anytime_valid = False
    validity = "asymptotic"  # a normal-approximation repeated CI (estimated variance): a Wald interval per look

    def __init__(self, confidence: float = 0.95, target: str = "bank", spending: str = "ld-pocock",
                 look_size: int = 100) -> None:
        super().__init__(confidence=confidence, target=target)
        self.spending = spending
        self.look_size = look_size

    def _validate_params(self) -> None:
        super()._validate_params()
        parse_spending(self.spending)
        check_positive(self.look_size, "look_size")

    def _start_extra(self) -> None:
        self.look_n_: list[int] = []

    def _absorb(self, items: np.ndarray, scores: np.ndarray) -> None:
        self.look_n_.append(self.n_scored)

    def _state_extra(self) -> dict[str, Any]:
        return {"look_n": list(self.look_n_)}

    def _load_extra(self, extra: dict[str, Any]) -> None:
        if "look_n" in extra:
            self.look_n_ = [int(v) for v in extra["look_n"]]

    def multiplier(self) -> float:
        return boundary_multiplier(self.spending, 1.0 - float(self.confidence), self.look_n_,
                                   self.bank_.n_items, self.look_size, sides=2)

    def result(self) -> Estimate:
        self._check_started()
        guarantee = ("asymptotic: group-sequential repeated CI (Jennison & Turnbull ch. 9), normal approximation "
                     f"with an estimated variance: simultaneous coverage over the looks at {self.confidence:g} "
                     f"only as the sample grows (not for skewed scores at small n), spending {self.spending} on n/N")
        if self.n_scored == 0:
            return self._empty_estimate(guarantee)
        order = self.order_
        codes = self.bank_.subset_codes()[order] if self.bank_.subsets is not None and self.bank_.mean_of_means else None
        mean, var = mean_of_means(self.scores_[order], codes, self.bank_.n_subsets if codes is not None else None)
        mean, var = float(mean), float(var)
        exhausted = self.exhausted
        if exhausted and self.target == "bank":
            lower = upper = mean  # the bank mean is known exactly
        elif not math.isfinite(var):
            lower, upper = 0.0, 1.0
        else:
            half = self.multiplier() * math.sqrt(var)
            lower, upper = max(0.0, mean - half), min(1.0, mean + half)
        return Estimate(self.name, mean, lower, upper, self.n_scored, float(self.confidence), False, self.target,
                        self.bank_.n_items, guarantee, exhausted, validity=self.validity)


def boundary_multiplier(spending: str, alpha: float, look_n: Sequence[int], n_max: int, look_size: int,
                        sides: int = 2) -> float:
    """Critical value for the latest look, given the item counts of all looks so far.

    Spending functions use the observed fractions ``n_k / n_max`` (unplanned looks are fine);
    classical boundaries use the planned looks of ``look_size`` items and are evaluated at
    the look's index (a constant for Pocock).
    """
    if not look_n:
        return float("inf")
    name, _ = parse_spending(spending)
    counts = [min(int(n), n_max) for n in look_n]
    if name in CLASSICAL:
        planned = list(range(look_size, n_max, look_size)) + [n_max]
        fractions = tuple(n / n_max for n in planned)
        boundary = group_sequential_boundary(None, alpha, spending, fractions=fractions, sides=sides)
        k = min(len(counts), len(planned)) - 1
        return boundary.boundaries[k]
    # drop repeated counts (a look that added nothing): fractions must increase
    fractions: list[float] = []
    for n in counts:
        f = n / n_max
        if not fractions or f > fractions[-1] + 1e-12:
            fractions.append(f)
    boundary = group_sequential_boundary(None, alpha, spending, fractions=tuple(fractions), sides=sides, interim=True)
    return boundary.boundaries[-1]


