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

from collections.abc import Sequence

import numpy as np

from certeval.errors import InputError

from ..distribution.comparison import A_GT_B, B_GT_A, UNDECIDED
from ..validation import check_positive
from .ranking import BankPairTable, assemble_ranking
from .selection import BankSelection

GUARANTEE = ("bank target, anytime-valid: each model's bank mean in an exact without-replacement betting confidence "
             "sequence (Waudby-Smith & Ramdas 2020; empirical-Bernstein beyond tens of models) at level "
             "1 - alpha/M, items drawn in proportion to their weights")


class BankPrecision(BankSelection):
    """:class:`~.selection.BankSelection`'s per-model streams and looks with the leaderboard's rule: a model
    leaves ("precise") once its half-width is at most ``halfwidth``. ``result()`` is a :class:`~certeval.estimators.distribution.ranking.Ranking`;
    ``model_intervals()`` every model's (mean, lower, upper, items)."""

    def __init__(self, names: Sequence[str], *, halfwidth: float, alpha: float = 0.05) -> None:
        super().__init__(names, alpha=alpha, paired=False)  # per-model intervals are the statement
        if len(self.names) < 2 or len(set(self.names)) != len(self.names):
            raise InputError(f"a leaderboard needs two or more distinct models, got {len(self.names)}")
        self.halfwidth = check_positive(halfwidth, "halfwidth")

    def _decide(self, live: np.ndarray) -> None:
        for j in live:
            if (self.upper[j] - self.lower[j]) / 2 <= self.halfwidth:
                self.status[j], self.look_of[j] = "precise", self.looks
        self.finished = not (self.status == "running").any()

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
