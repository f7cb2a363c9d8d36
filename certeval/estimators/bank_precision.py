"""Leaderboard precision on the bank target (``rank --goal halfwidth:E``): every model's bank mean within ±E,
simultaneously, and the order statements those intervals imply.

Each model has the exact without-replacement confidence sequence of :mod:`.wor_streams` for its bank mean at
level ``alpha / M`` (Bonferroni over the M models, the per-model intervals a bank ranking prints), on the run's
shared order drawn ∝ weight. A model leaves as soon as its interval's half-width is at most E; the run ends
when every model has left (at exhaustion every interval is the exact mean). Order statements: "a>b" when a's
interval lies above b's (then ``mu_a − mu_b`` lies in ``[lower_a − upper_b, upper_a − lower_b]``, above 0);
models whose intervals overlap share a tie group. On the event that every model's CS covers (probability
>= 1 − alpha, at any stopping time) every interval and every statement is true, jointly.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ._validation import InputError, check_alpha, check_positive
from .bank_ranking import BankPairTable, assemble_ranking, look_arrays
from .comparison import A_GT_B, B_GT_A, UNDECIDED
from .wor_streams import absorb_rows, check_weights, make_streams

GUARANTEE = ("bank target, anytime-valid: each model's bank mean in an exact without-replacement betting confidence "
             "sequence (Waudby-Smith & Ramdas 2020; empirical-Bernstein beyond tens of models) at level "
             "1 - alpha/M, items drawn in proportion to their weights")


class BankPrecision:
    """``start(weights)``, ``update(items, scores)`` per look (bank positions, ``(M, b)`` scores; rows of models
    that left are ignored), ``active``, ``model_intervals()``, ``result()`` (a :class:`~.ranking.Ranking`)."""

    def __init__(self, names: Sequence[str], *, halfwidth: float, alpha: float = 0.05) -> None:
        self.names = tuple(str(x) for x in names)
        if len(self.names) < 2 or len(set(self.names)) != len(self.names):
            raise InputError(f"a leaderboard needs two or more distinct models, got {len(self.names)}")
        self.alpha = check_alpha(alpha)
        self.halfwidth = check_positive(halfwidth, "halfwidth")

    def start(self, weights: np.ndarray, bet_horizon: int | None = None) -> "BankPrecision":
        self.w = check_weights(weights)
        m = len(self.names)
        self.streams = make_streams(m, self.w.size, self.alpha / m, bet_horizon)
        self.open = np.ones(m, dtype=bool)
        self.used = np.zeros(m, dtype=np.int64)
        self.mean = np.full(m, np.nan)
        self.lower = np.zeros(m)
        self.upper = np.ones(m)
        self.n = 0
        return self

    @property
    def n_total(self) -> int:
        return int(self.w.size)

    @property
    def active(self) -> list[str]:
        return [self.names[k] for k in np.flatnonzero(self.open)]

    def update(self, items: Any, scores: Any) -> "BankPrecision":
        items, x = look_arrays(self.names, items, scores)
        if items.size == 0:
            return self
        if self.n + items.size > self.n_total:
            raise InputError(f"more items ({self.n + items.size}) than the bank holds ({self.n_total})")
        live = np.flatnonzero(self.open)
        if np.isnan(x[live]).any():
            raise InputError("every model still in play needs a score for every item of the look")
        self.n += items.size
        absorb_rows(self.streams, live, x[live], self.w[items])
        mean, lower, upper = self.streams.bounds()
        self.mean[live], self.lower[live], self.upper[live] = mean[live], lower[live], upper[live]
        self.used[live] = self.n
        precise = (self.upper - self.lower) / 2 <= self.halfwidth
        self.open &= ~precise
        return self

    def model_intervals(self) -> dict[str, tuple[float, float, float, int]]:
        return {n: (float(self.mean[k]), float(self.lower[k]), float(self.upper[k]), int(self.used[k]))
                for k, n in enumerate(self.names)}

    def guarantee(self) -> str:
        m = len(self.names)
        return (f"{GUARANTEE}; every model's interval and every order statement (a>b: a's interval above b's) "
                f"hold jointly with probability >= {1 - self.alpha:g} (Bonferroni over the {m} models)")

    def result(self):
        m = len(self.names)
        a, b = (v.astype(np.int64) for v in np.triu_indices(m, k=1))
        lower, upper = self.lower[a] - self.upper[b], self.upper[a] - self.lower[b]
        verdict = np.full(len(a), UNDECIDED, dtype=np.int64)
        verdict[lower > 0] = A_GT_B
        verdict[upper < 0] = B_GT_A
        used = np.minimum(self.used[a], self.used[b])
        table = BankPairTable(self.names, a, b, verdict, np.zeros(len(a), dtype=np.int64), used,
                              self.mean[a] - self.mean[b], lower, upper, self.n_total, 1.0 - self.alpha, 0.0,
                              self.guarantee())
        return assemble_ranking(table, self.mean, self.used, alpha=self.alpha, halfwidth=self.halfwidth)

