"""Shared machinery for single-model methods whose strata are the bank's sub-datasets.

The estimand is ``Σ_i w_i x_i`` with ``w = BankSpec.weights()``: the bank mean,
or the mean-of-means over sub-datasets (Arviv et al. 2026, eq. 1). Items within a
sub-dataset carry equal weight, so stratifying by sub-dataset turns the
estimand into ``Σ_h W_h μ_h`` (``W_h`` the stratum's total weight, ``μ_h`` its
plain mean). Each stratum gets an interval at level ``δ/H`` and the overall
interval is ``[Σ W_h lo_h, Σ W_h hi_h]``: by the union bound every stratum
interval holds simultaneously with probability ≥ 1 − δ, and then so does the
weighted sum (and every per-subset interval reported beside it).
"""

from __future__ import annotations

from dataclasses import dataclass
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


def kmeans_labels(x: np.ndarray, k: int, seed: int, n_init: int = 4, max_iter: int = 100) -> np.ndarray:
    """Lloyd's k-means with k-means++ seeding (Arthur & Vassilvitskii 2007), best of ``n_init`` starts.

    Plain numpy with ``np.random.default_rng(seed)``: deterministic, and free of the thread pools that
    made scikit-learn's ``KMeans`` take seconds per call on a loaded 2-core machine.
    """
    rng = np.random.default_rng(seed)
    sq_norms = np.einsum("ij,ij->i", x, x)
    best, best_inertia = np.zeros(x.shape[0], dtype=np.int64), np.inf
    for _ in range(n_init):
        centres = [x[rng.integers(x.shape[0])]]
        dist = np.maximum(sq_norms - 2 * x @ centres[0] + centres[0] @ centres[0], 0.0)
        for _ in range(1, k):
            p = dist / dist.sum() if dist.sum() > 0 else None
            c = x[rng.choice(x.shape[0], p=p)]
            centres.append(c)
            dist = np.minimum(dist, np.maximum(sq_norms - 2 * x @ c + c @ c, 0.0))
        centres = np.array(centres)
        labels = np.full(x.shape[0], -1, dtype=np.int64)
        for _ in range(max_iter):
            d2 = sq_norms[:, None] - 2 * x @ centres.T + np.einsum("ij,ij->i", centres, centres)[None, :]
            new = np.argmin(d2, axis=1)
            if np.array_equal(new, labels):
                break
            labels = new
            for j in range(k):
                members = labels == j
                if members.any():
                    centres[j] = x[members].mean(axis=0)
        inertia = float(np.sum(np.min(d2, axis=1)))
        if inertia < best_inertia:
            best, best_inertia = labels, inertia
    return best


def feature_strata(features: np.ndarray, base: np.ndarray, max_clusters: int = 4, min_size: int = 50,
                   seed: int = 0) -> np.ndarray:
    """Strata from item features only: k-means inside each stratum of ``base`` (compact codes 0..H−1).

    A base stratum of N items gets K = min(max_clusters, ⌊N / min_size⌋) clusters
    (:func:`kmeans_labels`, seeded by ``seed``); K is lowered while the smallest cluster has fewer than
    ``min_size // 2`` items. The partition is a deterministic function of (features, base, parameters):
    it never looks at a score, so it is fixed before any data arrive and every stratum's sampling stays
    uniform without replacement (Cer-Eval's adaptive partition, Wang et al. 2025, arXiv:2505.03814 Alg. 2, re-fits on scores,
    which breaks that).
    """
    feats = np.asarray(features, dtype=float)
    codes = np.zeros(base.size, dtype=np.int64)
    next_code = 0
    for b in np.unique(base):
        idx = np.flatnonzero(base == b)
        x = feats[idx]
        labels = np.zeros(idx.size, dtype=np.int64)
        k = min(int(max_clusters), idx.size // max(int(min_size), 1), np.unique(x, axis=0).shape[0])
        while k >= 2:
            labels = kmeans_labels(x, k, seed)
            if np.bincount(labels, minlength=k).min() >= max(int(min_size) // 2, 1):
                break
            k -= 1
            labels = np.zeros(idx.size, dtype=np.int64)
        _, labels = np.unique(labels, return_inverse=True)
        codes[idx] = next_code + labels
        next_code += int(labels.max()) + 1
    return codes


class StratifiedMethod(BankMethod):
    """A method with one stratum per sub-dataset (one stratum for a plain bank).

    Subclasses implement ``_stratum_interval(h) -> (lo, hi)`` and may override
    ``_choose``. ``_stratum_delta`` is the per-stratum error level δ/H.
    """

    guarantee_text = ""

    def _start_extra(self) -> None:
        spec = self.bank_
        self.item_weights_ = spec.weights()
        self.strata_ = self._make_strata(self.subset_strata(spec))
        n_strata = int(self.strata_.max()) + 1
        # sub-dataset of each stratum (strata never straddle two sub-datasets)
        self.stratum_subset_ = np.zeros(n_strata, dtype=np.int64)
        self.stratum_subset_[self.strata_] = self.subset_strata(spec)
        self.stratum_size_ = np.bincount(self.strata_, minlength=n_strata)
        self.stratum_weight_ = np.bincount(self.strata_, weights=self.item_weights_, minlength=n_strata)
        self.stratum_n_ = np.zeros(n_strata, dtype=np.int64)
        self.stratum_sum_ = np.zeros(n_strata)
        self.stratum_sumsq_ = np.zeros(n_strata)
        self._live_strata = np.flatnonzero(self.stratum_size_ > 0)
        self._stratum_delta = self.delta / max(1, self._live_strata.size)
        self._start_strata()

    @staticmethod
    def subset_strata(spec) -> np.ndarray:
        """One stratum per sub-dataset when the estimand is the mean-of-means, else one stratum."""
        if spec.subsets is not None and spec.mean_of_means:
            return spec.subset_codes()
        return np.zeros(spec.n_items, dtype=np.int64)

    def _make_strata(self, base: np.ndarray) -> np.ndarray:
        """Hook: stratum code per item, refining ``base`` (the sub-dataset strata); default: ``base``."""
        return base

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
        if lo > hi:  # the interval missed what is certain (probability ≤ δ): report the certain bounds
            lo, hi = max(f_lo, 0.0), min(f_hi, 1.0)
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
            if np.array_equal(self.stratum_subset_, np.arange(n_strata)):  # strata are the sub-datasets
                subsets = tuple(
                    SubsetEstimate(
                        subset=names[h], mean=float(means[h]), lower=float(lows[h]), upper=float(highs[h]),
                        n_scored=int(self.stratum_n_[h]), n_total=int(self.stratum_size_[h]),
                        weight=float(self.stratum_weight_[h]),
                    )
                    for h in self._live_strata
                )
            else:  # finer strata: a sub-dataset's interval is the weighted sum of its strata's (same event)
                subsets = self._subset_estimates(means, lows, highs, names)
        return Estimate(
            method=self.name, mean=point, lower=lo, upper=hi, n_scored=self.n_scored,
            confidence=float(self.confidence), anytime_valid=self.anytime_valid, target=self.target,
            n_total=self.bank_.n_items, guarantee=self.guarantee_text, exhausted=self.exhausted,
            subsets=subsets, extra=self._result_extra(),
        )

    def _subset_estimates(self, means, lows, highs, names) -> tuple[SubsetEstimate, ...]:
        out = []
        for s in np.unique(self.stratum_subset_[self._live_strata]):
            hs = self._live_strata[self.stratum_subset_[self._live_strata] == s]
            w = self.stratum_weight_[hs]
            share = w / w.sum()
            point, lo, hi = combine_strata(means[hs], lows[hs], highs[hs], share)
            out.append(SubsetEstimate(
                subset=names[s], mean=point if np.isfinite(means[hs]).any() else float("nan"), lower=lo, upper=hi,
                n_scored=int(self.stratum_n_[hs].sum()), n_total=int(self.stratum_size_[hs].sum()),
                weight=float(w.sum()),
            ))
        return tuple(out)

    def _result_extra(self) -> tuple[tuple[str, Any], ...]:
        return (("n_strata", int(self._live_strata.size)),)


def bernstein_proxy(n: np.ndarray, size: np.ndarray, var: np.ndarray, log_term: float) -> np.ndarray:
    """Empirical-Bernstein-shaped radius proxy with finite-population factor; ∞ at n = 0, 0 at n = size.

    ∞ at n = 0 makes every stratum get a first item before any gets a second.
    """
    n = np.asarray(n, dtype=float)
    safe = np.maximum(n, 1.0)
    r = (np.sqrt(2.0 * var * log_term / safe) + log_term / safe) * np.sqrt(np.clip(1.0 - n / size, 0.0, 1.0))
    return np.where(n > 0, r, np.inf)


def greedy_allocation(k: int, gain_fn, counts: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Allocate k slots one at a time to the stratum with the largest marginal gain.

    ``gain_fn(c)`` gives, elementwise, the gain of one more item in a stratum that
    already has ``c`` (any array shape); the gains of the next k slots of every
    stratum are computed at once, then picked greedily.
    """
    steps = counts[:, None] + np.arange(k)[None, :]
    gains = np.asarray(gain_fn(steps), dtype=float)
    gains = np.where(np.arange(k)[None, :] < capacity[:, None], gains, -np.inf)
    alloc = np.zeros(counts.size, dtype=np.int64)
    rows = np.arange(counts.size)
    for _ in range(k):
        current = gains[rows, np.minimum(alloc, k - 1)]
        current = np.where(alloc < k, current, -np.inf)
        h = int(np.argmax(current))
        if current[h] == -np.inf:
            break
        alloc[h] += 1
    return alloc


def stratified_moments(q: np.ndarray, share: np.ndarray, var: np.ndarray,
                       a: np.ndarray) -> tuple[float, tuple[float, float]]:
    """Variance and reach of the stratified control-variate statistic ``Y`` under the stratum law ``q``.

    ``share`` = U_h/U (undrawn weight), ``var`` = σ̂_h², ``a`` the controls: ``Y − ν ≈ (share_h/q_h)(X − a_h)``, so
    ``Var(Y) ≈ Σ share_h² σ̂_h² / q_h`` and Y can fall by ``max_h (share_h/q_h) a_h`` and rise by
    ``max_h (share_h/q_h)(1 − a_h)`` over the strata it can be drawn from.
    """
    on = q > 0
    ratio = share[on] / q[on]
    return (float(np.sum(ratio * share[on] * var[on])),
            (float(np.max(ratio * a[on])), float(np.max(ratio * (1.0 - a[on])))))


@dataclass(frozen=True)
class DrawRows:
    """Logged draws, one row per draw in log order: the undrawn weight ``u`` and known sums ``known`` of each
    stratum before it, its stratum law ``q``, controls ``a`` and predicted variances ``v`` (draws × strata), its
    stratum ``h`` and its score ``x``."""

    u: np.ndarray
    known: np.ndarray
    q: np.ndarray
    a: np.ndarray
    v: np.ndarray
    h: np.ndarray
    x: np.ndarray


def joint_statistic(group: np.ndarray, w_group: float, draws: DrawRows) -> tuple[np.ndarray, ...] | None:
    """Y = [h∈G] (U_h/U_G)/q_h (x − a_h) + Σ_{g∈G} (U_g/U_G) a_g, with E[Y | past] = (W_G m − K_G)/U_G, for each
    of ``draws``. A draw whose group has no undrawn weight left observes nothing."""
    u_g = draws.u[:, group].sum(axis=1)
    keep = u_g > 0
    if not keep.any():
        return None
    u, known, q, a, v, h, x, u_g = (arr[keep] for arr in (draws.u, draws.known, draws.q, draws.a, draws.v, draws.h,
                                                          draws.x, u_g))
    rows = np.arange(h.size)
    share = np.where(group, u / u_g[:, None], 0.0)
    base = (share * np.nan_to_num(a)).sum(axis=1)
    drawable = q > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(group & drawable, share / q, 0.0)
    y = base + np.where(group[h], ratio[rows, h] * (x - a[rows, h]), 0.0)
    in_play = group & drawable
    lows = np.where(in_play, base[:, None] - ratio * a, base[:, None])
    highs = np.where(in_play, base[:, None] + ratio * (1.0 - a), base[:, None])
    y_min = np.where(drawable, lows, np.inf).min(axis=1)
    y_max = np.where(drawable, highs, -np.inf).max(axis=1)
    var = np.where(in_play, q * ratio**2 * v, 0.0).sum(axis=1)  # ≈ Var(Y) if a_h ≈ μ_h
    k_g = known[:, group].sum(axis=1)
    return y, y_min, y_max, w_group / u_g, -k_g / u_g, var
