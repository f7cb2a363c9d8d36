"""Shared machinery for single-model methods whose strata are the bank's sub-datasets.

The estimand is ``Σ_i w_i x_i`` with ``w = BankSpec.weights()``: the bank mean,
or the mean-of-means over sub-datasets (seed 004, eq. 1). Items within a
sub-dataset carry equal weight, so stratifying by sub-dataset turns the
estimand into ``Σ_h W_h μ_h`` (``W_h`` the stratum's total weight, ``μ_h`` its
plain mean). Each stratum gets an interval at level ``δ/H`` and the overall
interval is ``[Σ W_h lo_h, Σ W_h hi_h]``: by the union bound every stratum
interval holds simultaneously with probability ≥ 1 − δ, and then so does the
weighted sum (and every per-subset interval reported beside it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..protocol import BankMethod
from ..results import Estimate, SubsetEstimate


def combine_strata(means: np.ndarray, lows: np.ndarray, highs: np.ndarray, weights: np.ndarray) -> tuple[float, float, float]:
    """Weighted point estimate and union-bound interval of ``Σ W_h μ_h``.

    A stratum with no data (NaN mean) contributes the midpoint of its interval.
    """
    point = np.where(np.isfinite(means), means, 0.5 * (lows + highs))
    return float(weights @ point), float(weights @ lows), float(weights @ highs)


class StratifiedMethod(BankMethod):
    """A method with one stratum per sub-dataset (one stratum for a plain bank).

    Subclasses implement ``_stratum_interval(h) -> (lo, hi)`` and may override
    ``_choose``. ``_stratum_delta`` is the per-stratum error level δ/H.
    """

    guarantee_text = ""

    def _start_extra(self) -> None:
        spec = self.bank_
        self.item_weights_ = spec.weights()
        if spec.subsets is not None and spec.mean_of_means:
            self.strata_ = spec.subset_codes()
        else:
            self.strata_ = np.zeros(spec.n_items, dtype=np.int64)
        n_strata = int(self.strata_.max()) + 1
        self.stratum_size_ = np.bincount(self.strata_, minlength=n_strata)
        self.stratum_weight_ = np.bincount(self.strata_, weights=self.item_weights_, minlength=n_strata)
        self.stratum_n_ = np.zeros(n_strata, dtype=np.int64)
        self.stratum_sum_ = np.zeros(n_strata)
        self.stratum_sumsq_ = np.zeros(n_strata)
        self._live_strata = np.flatnonzero(self.stratum_size_ > 0)
        self._stratum_delta = self.delta / max(1, self._live_strata.size)
        self._start_strata()

    def _start_strata(self) -> None:
        """Hook: per-stratum state."""

    @property
    def n_strata(self) -> int:
        return int(self.stratum_size_.size)

    def _absorb(self, items: np.ndarray, scores: np.ndarray) -> None:
        codes = self.strata_[items]
        np.add.at(self.stratum_n_, codes, 1)
        np.add.at(self.stratum_sum_, codes, scores)
        np.add.at(self.stratum_sumsq_, codes, scores**2)
        for h in np.unique(codes):
            self._absorb_stratum(int(h), scores[codes == h])  # keeps arrival order within the stratum

    def _absorb_stratum(self, h: int, scores: np.ndarray) -> None:
        """Hook: incremental per-stratum statistics (scores in arrival order)."""

    def _stratum_mean(self, h: int) -> float:
        n = self.stratum_n_[h]
        return float(self.stratum_sum_[h] / n) if n else float("nan")

    def _stratum_feasible(self, h: int) -> tuple[float, float]:
        """Deterministic bounds of a finite stratum's mean (for ``target='bank'``), else [0, 1]."""
        if self.target != "bank":
            return 0.0, 1.0
        size = self.stratum_size_[h]
        total = self.stratum_sum_[h]
        return total / size, (total + size - self.stratum_n_[h]) / size

    def _stratum_interval(self, h: int) -> tuple[float, float]:
        raise NotImplementedError

    def _clip_to_feasible(self, h: int, lo: float, hi: float) -> tuple[float, float]:
        f_lo, f_hi = self._stratum_feasible(h)
        lo, hi = max(lo, f_lo, 0.0), min(hi, f_hi, 1.0)
        if lo > hi:  # float rounding only
            lo = hi = 0.5 * (lo + hi)
        return lo, hi

    def _overall_interval(self, means, lows, highs) -> tuple[float, float, float]:
        """Combine stratum intervals; subclasses with a tighter joint construction override this."""
        return combine_strata(means, lows, highs, self.stratum_weight_)

    def result(self) -> Estimate:
        self._check_started()
        if self.n_scored == 0:
            return self._empty_estimate(self.guarantee_text)
        n_strata = self.n_strata
        means = np.array([self._stratum_mean(h) for h in range(n_strata)])
        lows, highs = np.zeros(n_strata), np.ones(n_strata)
        for h in self._live_strata:
            lows[h], highs[h] = self._stratum_interval(int(h))
        point, lo, hi = self._overall_interval(means, lows, highs)
        point = min(max(point, lo), hi)
        subsets: tuple[SubsetEstimate, ...] = ()
        if self.bank_.subsets is not None and self.bank_.mean_of_means:
            names = self.bank_.names()
            subsets = tuple(
                SubsetEstimate(
                    subset=names[h], mean=float(means[h]), lower=float(lows[h]), upper=float(highs[h]),
                    n_scored=int(self.stratum_n_[h]), n_total=int(self.stratum_size_[h]),
                    weight=float(self.stratum_weight_[h]),
                )
                for h in self._live_strata
            )
        return Estimate(
            method=self.name, mean=point, lower=lo, upper=hi, n_scored=self.n_scored,
            confidence=float(self.confidence), anytime_valid=self.anytime_valid, target=self.target,
            n_total=self.bank_.n_items, guarantee=self.guarantee_text, exhausted=self.exhausted,
            subsets=subsets, extra=self._result_extra(),
        )

    def _result_extra(self) -> tuple[tuple[str, Any], ...]:
        return (("n_strata", int(self._live_strata.size)),)
